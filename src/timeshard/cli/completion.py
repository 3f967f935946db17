"""``timeshard completion bash|zsh``: the shell code that completes ``timeshard`` commands and
options (argcomplete), e.g. ``eval "$(timeshard completion bash)"`` in ``~/.bashrc``."""

from __future__ import annotations

import argparse

from argcomplete.shell_integration import shellcode

SHELLS = ("bash", "zsh")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "completion",
        help="print the shell completion script for bash or zsh",
        description='Add to ~/.bashrc: eval "$(timeshard completion bash)"; to ~/.zshrc: '
        'eval "$(timeshard completion zsh)".',
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=cmd_completion)


def script(shell: str) -> str:
    return shellcode(["timeshard"], shell=shell)


def cmd_completion(args: argparse.Namespace) -> int:
    print(script(args.shell), end="")
    return 0
