"""The changeset of a loop: Flor's Table 2 rules, and the refinements flortrain adds to them.

Each rule lives in its own module under :mod:`flortrain.static.changeset.rules`, with the cases
that define it (a script, and the changeset of its one candidate loop or the reason it is
refused); the test suite runs every case and docs/changeset.md lists the rules from the same
modules. :mod:`~flortrain.static.changeset.walker` walks a loop's statements and hands each to the
rule that applies; :mod:`~flortrain.static.changeset.loop` filters the result to what a skipped
loop must restore.
"""
