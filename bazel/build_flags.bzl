# The compile and link flags of fusekit's kernel plugin, in one place:
# CMakeLists.txt and fusekit.build_plugin (fusekit/toolchain/plugin_build.py)
# read this file, BUILD loads it.  Keep the dict below plain JSON (double
# quotes, no comments or trailing commas inside it): CMake parses it as JSON
# and Python as a literal.
FLAGS = {
    "std": "c++17",
    "optimize": ["-O3"],
    "warnings": ["-Wall", "-Wextra"],
    "defines": ["-DFLATBUFFERS_LOCALE_INDEPENDENT=0"],
    "prelude": "fusekit/simd_targets.h",
    "x86_64_baseline": "x86-64-v2",
    "visibility": ["-fvisibility=hidden", "-fvisibility-inlines-hidden"],
    "link": ["-Wl,--no-undefined"]
}
