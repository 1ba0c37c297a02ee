"""``python -m flortrain`` is the ``flortrain`` command."""

from flortrain.cli import main

main()
