"""Units every figure is quoted in."""

MB = 1 << 20  # a mebibyte: every "MB" this product reports is 2**20 bytes
