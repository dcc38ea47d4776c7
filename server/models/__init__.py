"""The decoder-only transformer shared by every supported architecture."""
