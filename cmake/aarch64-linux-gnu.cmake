# Cross-compiling fusekit for linux aarch64 on another Linux machine with
# Debian's (or Ubuntu's) cross toolchain and arm64 multiarch headers:
#   apt-get install g++-aarch64-linux-gnu libhwy-dev:arm64 libflatbuffers-dev:arm64
#   cmake -S . -B build/aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# (scripts/build_aarch64.sh builds the wheel with it).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(FUSEKIT_CROSS_TRIPLE aarch64-linux-gnu CACHE STRING "target triple of the cross compiler")
set(CMAKE_C_COMPILER ${FUSEKIT_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${FUSEKIT_CROSS_TRIPLE}-g++)

# Headers and libraries of the target come from the multiarch folders
# (/usr/include/aarch64-linux-gnu, /usr/lib/aarch64-linux-gnu) and the
# cross toolchain's own root; programs (the build's tools) from the host.
# The arch-independent headers in /usr/include (Highway, flatbuffers) are
# the same files for every architecture, so /usr stays searchable.
set(CMAKE_FIND_ROOT_PATH /usr/${FUSEKIT_CROSS_TRIPLE} /usr)
set(CMAKE_LIBRARY_ARCHITECTURE ${FUSEKIT_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
