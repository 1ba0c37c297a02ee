"""The commands under the CLI that are more than a call into one package: ``flortrain record``.

The other commands' entries live in the package each is the front door of: replay in
:mod:`flortrain.replay`, ``diff`` in :mod:`flortrain.replay.diff`, ``instrument`` in
:mod:`flortrain.instrument`, ``check`` in :mod:`flortrain.check.command`.
"""
