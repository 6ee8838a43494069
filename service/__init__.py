"""The online half of tandem: a FastAPI service that encodes queries with the student and searches a bundle."""
