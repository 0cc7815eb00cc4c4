"""Build helpers of the course site (`python -m scripts.build_book`) and its small Sphinx extension."""
