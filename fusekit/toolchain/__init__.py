"""Building users' kernel plugins: C++ sources -> a plugin library fusekit loads."""
