"""Data: sources to named groups of chat examples, flat pools clustered into groups, target split and previews."""
