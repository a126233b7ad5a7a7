"""Graph building blocks shared by `build_graph` and `sample_neighbourhoods`."""
