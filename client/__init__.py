"""Client SDK: market and provider HTTP clients, model export, verification, vouchers."""
