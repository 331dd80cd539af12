"""Building blocks shared by every pipeline file: typed config, step templates, the CLI."""
