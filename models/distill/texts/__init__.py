"""What a student trains on: corpus passages and pseudo-queries (`data`), train-split queries (`queries`), examples
and batches (`dataset`) and the backbone's tokenizer (`tokens`)."""
