"""Generated wire code; see scripts/gen_proto.py."""
