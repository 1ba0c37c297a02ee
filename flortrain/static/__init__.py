"""The static pass: parse a script with libcst, analyse its loops, produce a frozen plan, and
transform the script by that plan. Nothing here imports torch."""
