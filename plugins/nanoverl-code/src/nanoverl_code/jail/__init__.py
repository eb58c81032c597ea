"""The sandbox's own processes, standard library only: sandbox.py runs `python -I -S jail/__main__.py`.

One launch scores one program against the test cases of one row. Reading a spec (JSON) from stdin:

    launcher  (on the host) dies with the reward worker (PR_SET_PDEATHSIG); opens the row's cgroup folders;
              unshare(2) of mount, PID, network, IPC and UTS namespaces (and a user namespace when not root);
              forks the row's init
    init      PID 1 of the row's namespaces: builds a read-only root once (a tmpfs with read-only binds of
              /usr, /lib*, /bin, the interpreter's prefix, a few /etc files, /dev/null & co) and pivots into it;
              then runs the test cases one by one, each in a process of its own, and writes each outcome as
              one JSON line on stdout
    case      one test case, from nothing: new mount, network, IPC and UTS namespaces, a fresh tmpfs /tmp,
              a cgroup of its own; forks the checker (assert tests), then, in a new PID namespace, the reaper;
              watches the deadline, the output, the CPU time and the memory of the cgroup; at the end kills
              the reaper (and with it every process of the test case) and removes the cgroup
    reaper    PID 1 of the test case's PID namespace: a fresh /proc, forks the program, reaps; when the
              program exits it reports the wait status and exits, and the kernel kills what is left
    program   a fresh interpreter (execve: nothing of the jail's memory, fds 0-5 only, a clean environment),
              in the test case's cgroup, under rlimits, as an unprivileged uid without capabilities, with
              no_new_privs and a seccomp filter; runs BOOT (wire.py): reads the program from fd 3 and runs
              it, and for call and assert tests answers calls of its functions on fds 4/5 with plain data
    checker   (assert tests) a fork of the case before the test's PID namespace exists, so the program can
              neither see, signal nor trace it; another unprivileged uid; runs the row's test code with the
              checker's own builtins, the names the test takes from the program being proxies that call it
              across the pipes (checker.py)

With "isolation": "rlimits" there are no namespaces: the same processes on the host, each test case in a
fresh host folder, the program confined to it by Landlock, its cgroup (or, as root, its fresh uid) swept at
the end (docs/code.md says what that does not stop).

The modules: launcher.py (the processes above), kernel.py (system calls, the root, cgroups, seccomp and
Landlock loading, uids), checker.py (the checker), wire.py (the frames and plain data both sides speak, and
BOOT). Exit statuses of BOOT that the case reads: 97 the program does not compile, 98 MemoryError, 96 exec
failed.
"""
