"""Drivers, benchmarks and their command-line parsers: the code that runs the mechanisms rather than
being them. `replay` and `soak` drive the live runtime under spot traces, `gradient_signal` measures
exploration's gradient signal, `bench` holds every benchmark and the report they feed. The core
packages (`flow_grpo`, `dispatch`, `exploration`, `elastic`, `spot`) never import from here."""
