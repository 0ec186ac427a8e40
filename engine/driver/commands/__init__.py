"""The `convalue` commands, one unit each (a function adding its arguments, a handler), grouped by what they work on;
engine/driver/cli.py registers them in one table and runs them."""
