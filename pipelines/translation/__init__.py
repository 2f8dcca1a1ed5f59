"""Machine translation: models, training, evaluation and serving."""
