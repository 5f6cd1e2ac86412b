"""`launcher doctor`: checks of this machine against a plan (driver, memory free, links)."""
