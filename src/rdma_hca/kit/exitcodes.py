"""Exit statuses every ``rdma-hca`` subcommand uses, one meaning per number across the CLI
(the table in docs/configuration.md lists them)."""

from __future__ import annotations

EXIT_OK = 0
# A check found a problem (doctor, check): the command ran, the answer is "no".
EXIT_FAIL = 1
# The command cannot run as asked: a bad flag, config file, variable or path.
EXIT_USAGE = 2
# stdout was closed early (`rdma-hca discover | head`): what a shell reports for a
# process ended by SIGPIPE (128 + 13), without the traceback Python would print.
EXIT_BROKEN_PIPE = 141
# SIGINT (Ctrl-C), for every command, serve included: 128 + SIGINT, as a shell reports it.
EXIT_INTERRUPTED = 130
# SIGTERM, for every command but serve (whose normal stop it is: 0): 128 + SIGTERM.
EXIT_TERMINATED = 143
