"""What every pipeline shares: config, strategy, tokenizers, metrics, plots, export."""
