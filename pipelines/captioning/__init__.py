"""Image captioning: a CNN encoder and an attention decoder (Show, Attend and Tell)."""
