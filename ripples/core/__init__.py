"""What every layer shares and nothing in it depends on the layers: the one validated
``Config``, the errors, the reduction ops, the optimizer wrapper's common face, slowdown
injection for benchmarks and demos, and the distribution's name."""
