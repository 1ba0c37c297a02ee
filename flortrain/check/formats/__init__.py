"""The output formats of ``flortrain check``, one module each: ``concise`` for people, ``json``
(a stable schema, docs/check.md), ``github`` workflow annotations and ``sarif`` 2.1.0."""
