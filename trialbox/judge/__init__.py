"""The judge: turns what a candidate did into a grade, from outside the candidate
(DESIGN.md, decision 2). Test code and expected answers stay in trusted processes; a
function-call test reaches the candidate through a proxy, and values cross the boundary
only as plain data through `codec` (exact builtin types, no pickle, no candidate
objects), so nothing the candidate returns, prints or exits with can make a test pass.
"""
