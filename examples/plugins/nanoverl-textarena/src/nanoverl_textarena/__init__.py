"""Example nanoverl plugin: the environment `textarena`, textarena's single-player games played unchanged (game.py)."""
