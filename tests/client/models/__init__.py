"""Tests of client.models: export, conversion, the real model, through the real sandbox."""
