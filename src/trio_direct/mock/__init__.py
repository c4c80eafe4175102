"""CPU mock SGLang engine."""
