// Keeps the module's library non-empty while it grows; holds nothing.
