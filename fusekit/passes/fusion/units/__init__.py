"""One module per fused op: each holds the op's fusion unit (its finder,
its emitter and ``attrs(match)``); fusion/table.py lists them in the order
the fusion passes run them."""
