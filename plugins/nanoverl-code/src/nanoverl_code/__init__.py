"""nanoverl-code: the `code` reward and the sandbox it runs programs in.

    sandbox.py   run_tests: one program against a row's test cases (the parent's side), probe, Limits
    jail.py      the sandbox's own processes (launcher, init, program boot, checker), stdlib only
    rewards.py   the `code` reward: the program from the response, the test layouts, the verdicts
    settings.py  [reward.code]
"""
