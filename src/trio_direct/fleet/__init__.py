"""The engines trio-direct serves from: URL parsing, probing, engine cards and the fleet."""
