"""Reference pipelines built on attention_layers."""
