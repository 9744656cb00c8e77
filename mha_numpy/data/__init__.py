"""Text for the language model: the corpus a package installs, its split, the byte tokenizer, the bigram baseline."""
