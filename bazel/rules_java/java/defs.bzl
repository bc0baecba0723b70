"""The names Bazel 4's @bazel_tools load from @rules_java//java:defs.bzl
(its JDK toolchain registration), forwarded to the rules built into Bazel.
fusekit builds no Java; the toolchain package must only parse."""

def java_binary(**attrs):
    native.java_binary(**attrs)

def java_import(**attrs):
    native.java_import(**attrs)

def java_library(**attrs):
    native.java_library(**attrs)

def java_runtime(**attrs):
    native.java_runtime(**attrs)

def java_toolchain(**attrs):
    native.java_toolchain(**attrs)

def java_proto_library(**attrs):
    native.java_proto_library(**attrs)
