"""nanoverl-code: the `code` reward and the sandbox it runs programs in.

    sandbox.py   run_tests: one program against a row's test cases (the parent's side), probe, Limits
    jail/        the sandbox's own processes (launcher, init, test case, reaper, program boot, checker), stdlib
                 only: launcher.py, kernel.py, checker.py, wire.py
    cgroups.py   where each execution's cgroup goes (v1 or v2), made and removed per launch
    seccomp.py   the programs' seccomp filter, compiled by libseccomp
    rewards.py   the `code` reward: the program from the response, the test layouts, the verdicts
    settings.py  [reward.code]
"""
