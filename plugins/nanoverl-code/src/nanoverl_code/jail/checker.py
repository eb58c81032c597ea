"""The checker: a row's test code run with the checker's own builtins against proxies of the program's
functions. Standard library only; it runs in the checker's process (launcher.Case.spawn_checker), which the
program can neither see nor signal.

What the program supplies is `program_names`: the row's entry point and the names its test code reads that
nothing else binds. What crosses from the program is data: a value (decoded as plain data), the class name
and message of an exception it raised (raised here as the checker's own ProgramRaised), or nothing.
"""

from __future__ import annotations

import ast
import builtins
import symtable

from .wire import Uncarried, decode, encode, recv, send

def program_names(code: str, bound: set[str], entry: str = "") -> list[str]:
    """The names a row's test code takes from the program: the global names it reads that neither the checker's
    setup (`bound`: the row's imports, setup code, a HumanEval prompt), the test code itself nor the builtins
    bind, and the row's entry point. Any other name (`abs`, `sorted`, `set`, a helper of the prompt) is the
    checker's own, whatever the program defines."""
    table = symtable.symtable(code, "test.py", "exec")
    read, own, star = set(), set(), set()
    tables = [table]
    while tables:
        t = tables.pop()
        tables.extend(t.get_children())
        module = t.get_type() == "module"
        for s in t.get_symbols():
            name = s.get_name()
            if module and (s.is_assigned() or s.is_imported()) or s.is_declared_global() and s.is_assigned():
                own.add(name)
            if s.is_referenced() and (module or s.is_global()):
                read.add(name)
    for node in ast.walk(ast.parse(code)):  # `from m import *`: the module's names are the test's own
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names) and node.module:
            try:
                module = __import__(node.module, fromlist=["*"])
                star |= set(getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")])
            except Exception:
                pass
    names = read - own - star - set(bound) - set(dir(builtins))
    return sorted(names | ({entry} if entry else set()))


def check(spec: dict, test: dict, req: int, rsp: int, limit: int) -> dict:
    """The checker: the row's test code, with the checker's own builtins, against proxies of the program's
    functions (only those of `program_names`); the verdict as a dict. What crosses from the program is data:
    a value (decoded as plain data), the class name and message of an exception it raised (raised here as
    ProgramRaised, never as the class it names), or nothing (it is gone). A failure of the call itself (the
    program gone, a value that is not plain data) ends the verdict whatever the test code does after it."""

    class ProgramRaised(Exception):
        """An exception the program raised: its class name and message, as the checker's own kind."""

    class Halt(BaseException):
        """A call that cannot be completed (the verdict is already decided)."""

    failure: dict = {}

    def halt(kind: str, detail: str = "") -> Halt:
        failure.setdefault("verdict", {"kind": kind, "detail": detail})
        return Halt()

    try:
        hello = recv(rsp, limit)
    except Uncarried:
        return {"kind": "runtime_error", "detail": "the program's first reply is not a well-formed frame"}
    if hello is None:
        return {"kind": "gone"}
    if not isinstance(hello, dict) or hello.get("ready") is not True:
        return {"kind": "runtime_error", "detail": "the program's first reply is not the one expected"}

    def proxy(name: str):
        def call(*args, **kwargs):
            if failure:
                raise Halt()
            try:
                request = {"name": name, "args": encode(list(args)), "kwargs": encode(kwargs)}
            except Uncarried as exc:
                raise halt("sandbox_refusal", f"the test passes a value the sandbox cannot carry: {exc}") from None
            try:
                send(req, request)
                reply = recv(rsp, limit)
            except Uncarried as exc:
                raise halt("runtime_error", f"the program's reply is not a well-formed frame ({exc})") from None
            except OSError:
                reply = None
            if reply is None:
                raise halt("gone")
            if type(reply) is dict and "value" in reply:
                try:
                    return decode(reply["value"])
                except Uncarried as exc:
                    raise halt("runtime_error", f"{name} returned malformed data ({exc})") from None
            if type(reply) is dict and "raised" in reply:
                raised = reply["raised"]
                kind, message = (str(raised[0])[:100], str(raised[1])[:300]) if type(raised) is list and \
                    len(raised) == 2 else ("?", "")
                if kind == "MemoryError":
                    raise halt("memory", "MemoryError in the program")
                exc = ProgramRaised(f"the program raised {kind}: {message}")
                exc.kind = kind
                raise exc
            if type(reply) is dict and "uncarried" in reply:
                raise halt("wrong_answer", f"{name} returned {str(reply['uncarried'])[:200]}")
            raise halt("runtime_error", "the program's reply is not one the checker knows")
        call.__name__ = name
        return call

    scope: dict = {"__name__": "__test__", "__builtins__": builtins}
    entry = spec.get("entry") or ""
    try:
        exec(compile(spec.get("setup") or "", "setup.py", "exec"), scope)
        for name in {*program_names(test["code"], set(scope), entry), *spec.get("names", [])}:
            scope[name] = proxy(name)
        exec(compile(test["code"], "test.py", "exec"), scope)
        if entry:
            scope["check"](scope[entry])
    except Halt:
        pass
    except AssertionError as exc:
        return failure.get("verdict") or {"kind": "wrong_answer", "detail": f"AssertionError: {exc}"}
    except ProgramRaised as exc:
        return failure.get("verdict") or {"kind": "runtime_error", "detail": str(exc)}
    except BaseException as exc:
        return failure.get("verdict") or {"kind": "wrong_answer", "detail": f"{type(exc).__name__}: {exc}"}
    return failure.get("verdict") or {"kind": "ok"}
