"""The .tflite model layer, the lowest floor of fusekit: reading, verifying,
viewing and writing a model.

* ``tflite_schema``: read-only accessors over the flatbuffer (no copy of the
  weights), generated field layout in ``_tflite_fields``;
* ``model_check``: the verifier every model passes before anything reads it;
* ``model_ops``: which operators, custom options and signatures a model holds;
* ``op_properties``: what fusekit knows about each builtin operator;
* ``flatbuffer_edit``: the schema's object API, and packing it back with the
  blobs of models written with buffer offsets;
* ``graph``: the graph view passes edit;
* ``kernel_metadata``: the ``fusekit_kernels`` metadata entry every packed
  model carries (the custom kernels it needs and where they come from);
* ``tensor_refs``: tensor indices inside quantization details (blockwise
  scales), kept pointing at their tensors through every rewrite;
* ``sub_byte``: INT4 / UINT4 / INT2 constants, packed and unpacked.

Importing this package imports none of them.  ``flatbuffer_edit``,
``tensor_refs`` and ``graph`` need ai-edge-litert's schema module (the conversion side); the
others need only numpy and flatbuffers, as on a device.
"""
