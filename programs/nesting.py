"""How deep a module nests: regions in regions, followed through the functions they call.

Pure (no JAX): :mod:`programs.opwalk` feeds it each op's function and depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CallGraph:
    """Each function's own deepest op and the calls it makes, at the depth it makes them."""

    own: dict[str, int] = field(default_factory=dict)
    calls: dict[str, list[tuple[int, str]]] = field(default_factory=dict)

    def reach(self, function: str, depth: int) -> None:
        """Note an op ``depth`` regions deep inside ``function`` (its body's ops are at 1)."""
        if depth > self.own.get(function, -1):
            self.own[function] = depth

    def call(self, caller: str, depth: int, callee: str) -> None:
        """Note a call to ``callee`` made ``depth`` regions deep inside ``caller``."""
        self.calls.setdefault(caller, []).append((depth, callee))

    def deepest(self, cap: int) -> int:
        """Return the deepest nesting of any function, calls followed (a body's ops are at 1).

        Counting stops past ``cap`` (the answer is then ``cap + 1``); a call cycle counts as
        past the cap. Iterative: a crafted chain of calls cannot exhaust Python's stack.
        """
        depth: dict[str, int] = {}
        deepest = 0
        for root in self.own.keys() | self.calls.keys():
            if root in depth:
                continue
            on_path: list[tuple[str, int]] = [(root, 0)]  # (function, next call to follow)
            open_now = {root}
            while on_path:
                function, index = on_path[-1]
                calls = self.calls.get(function, [])
                if index < len(calls):
                    on_path[-1] = (function, index + 1)
                    callee = calls[index][1]
                    if callee in open_now:
                        return cap + 1  # recursion: no finite nesting
                    if callee not in depth:
                        on_path.append((callee, 0))
                        open_now.add(callee)
                    continue
                level = self.own.get(function, 0)
                for at, callee in calls:  # the callee's body ops sit at the call's level
                    level = max(level, at - 1 + depth.get(callee, 1))
                depth[function] = min(level, cap + 1)
                open_now.discard(function)
                on_path.pop()
            deepest = max(deepest, depth[root])
            if deepest > cap:
                return cap + 1
        return deepest
