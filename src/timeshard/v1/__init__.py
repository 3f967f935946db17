"""Generated from proto/timeshard/v1 by tools/gen_proto.py. Do not edit."""
