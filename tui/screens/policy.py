"""Policy editor: the running policy as YAML; validate (the server's dry run, POST /admin/policy/validate),
apply (PUT /admin/policy) and see what changed.

Errors come back from the server with their key path, message and line (the server's parser knows where
each key and each syntax error sits); each is listed at its line and choosing one moves the cursor there.
History (Ctrl+O) lists applied versions and rolls back to one.
"""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from tui.client import ApiError, GatewayClient
from tui.documents import PolicyApplied, PolicyErrorItem
from tui.format import BAD, DIM, GOOD, WARN
from tui.monitor import monitor_of, reply
from tui.screens.policy_history import HistoryScreen
from tui.widgets import StatusLine


def yaml_language(editor: TextArea) -> str | None:
    """'yaml' when tree-sitter's YAML grammar is installed (textual[syntax]), else plain text."""
    return "yaml" if "yaml" in editor.available_languages else None


def diff_text(line: str) -> Text:
    """``path: old -> new`` with the old value red and the new one green."""
    path, sep, change = line.partition(": ")
    old, arrow, new = change.partition(" -> ")
    if not sep or not arrow:
        return Text(line)
    return Text.assemble((path, "bold"), ": ", (old, "red"), (" → ", DIM), (new, GOOD))


class PolicyScreen(Screen[None]):
    """Ctrl+T validate, Ctrl+S apply, Ctrl+R reload, Ctrl+O history; Esc moves between editor and list."""

    BINDINGS = [
        Binding("ctrl+t", "validate", "Validate"),
        Binding("ctrl+s", "apply", "Apply"),
        Binding("ctrl+r", "reload", "Reload"),
        Binding("ctrl+o", "history", "History"),
        Binding("escape", "toggle_focus", "Leave editor"),
    ]
    DEFAULT_CSS = """
    PolicyScreen #editor { height: 1fr; }
    PolicyScreen #verdict { height: 1; padding: 0 1; }
    PolicyScreen #findings { height: auto; max-height: 6; border: none; padding: 0; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.loaded_text: str | None = None

    @property
    def client(self) -> GatewayClient:
        return monitor_of(self).client

    def compose(self) -> ComposeResult:
        yield StatusLine()
        editor = TextArea.code_editor("", id="editor", soft_wrap=False)
        editor.language = yaml_language(editor)
        editor.border_title = "running policy"
        editor.read_only = True  # until the running policy is in: what was typed before, its load replaced
        yield editor
        yield Static(Text("loading the running policy…", style=DIM), id="verdict")
        yield OptionList(id="findings")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#editor", TextArea).focus()
        self.action_reload()

    @property
    def text(self) -> str:
        return self.query_one("#editor", TextArea).text

    def say(self, message: str, style: str = "") -> None:
        self.query_one("#verdict", Static).update(Text(message, style=style))

    def show_findings(self, options: list[Option]) -> None:
        findings = self.query_one("#findings", OptionList)
        findings.clear_options()
        findings.add_options(options)

    def show_errors(self, errors: list[PolicyErrorItem]) -> None:
        """Each error at its key path and the line the server gave; the editor jumps to the first."""
        options: list[Option] = []
        for err in errors:
            line = err.line
            where = f"L{line:<4}" if line else "     "
            label = Text.assemble((where, DIM), (err.path or "(file)", "bold"), ": ", (err.message, BAD))
            options.append(Option(label, id=f"{len(options)}:{line or 0}"))
        self.show_findings(options)
        first = next((int(str(o.id).split(":")[1]) for o in options if not str(o.id).endswith(":0")), None)
        if first:
            self.goto_line(first)

    def goto_line(self, line: int) -> None:
        editor = self.query_one("#editor", TextArea)
        editor.move_cursor((max(line - 1, 0), 0), center=True)

    @on(OptionList.OptionSelected, "#findings")
    def jump_to_finding(self, event: OptionList.OptionSelected) -> None:
        line = int(str(event.option.id or "0:0").split(":")[1])
        if line:
            self.goto_line(line)
            self.query_one("#editor", TextArea).focus()

    def action_toggle_focus(self) -> None:
        editor = self.query_one("#editor", TextArea)
        (self.query_one("#findings", OptionList) if editor.has_focus else editor).focus()

    @on(TextArea.Changed, "#editor")
    def mark_modified(self) -> None:
        modified = self.loaded_text is not None and self.text != self.loaded_text
        self.query_one("#editor", TextArea).border_title = "modified (Ctrl+S applies)" if modified else \
            "running policy"

    @work(exclusive=True, group="policy")
    async def action_reload(self) -> None:
        """Load the running policy from the server (discards unapplied edits)."""
        try:
            text = await reply(self, self.client.get_policy())
        except ApiError as e:
            self.say(f"cannot load the policy: {e.message}", BAD)
            return
        self.loaded_text = text
        editor = self.query_one("#editor", TextArea)
        editor.load_text(text)
        editor.read_only = False
        self.mark_modified()
        self.show_findings([])
        self.say("running policy loaded · Ctrl+T validate · Ctrl+S apply · Ctrl+O history", DIM)

    @work(exclusive=True, group="policy")
    async def action_validate(self) -> None:
        """The server's dry run: the same checks as an apply, at their lines, or the diff it would make;
        never applies."""
        try:
            result = await reply(self, self.client.validate_policy(self.text))
        except ApiError as e:
            self.report_failure(e)
            return
        if result is None:
            self.show_findings([])
            self.say("this server has no dry run (POST /admin/policy/validate) · Ctrl+S checks and applies only "
                     "a valid policy", WARN)
            return
        self.show_findings([Option(diff_text(line)) for line in result.diff])
        if not result.changed:
            self.say("✔ valid · the same as the running policy", GOOD)
        elif not result.diff:
            self.say("✔ valid · only the text differs (comments, layout): the policy stays the same", GOOD)
        else:
            self.say(f"✔ valid · {len(result.diff)} change(s) if applied (Ctrl+S)", GOOD)

    @work(exclusive=True, group="policy")
    async def action_apply(self) -> None:
        """PUT the editor's text; on success show the diff, on 422 each error at its line."""
        text = self.text
        try:
            result = await reply(self, self.client.put_policy(text))
        except ApiError as e:
            self.report_failure(e)
            return
        self.loaded_text = text
        self.mark_modified()
        self.show_result(result, "applied")

    def show_result(self, result: PolicyApplied, verb: str) -> None:
        diff = result.diff
        self.show_findings([Option(diff_text(line)) for line in diff])
        where = f" as version {result.version}" if result.version is not None else ""
        if not result.changed:
            self.say(f"✔ {verb}{where}: nothing changed", GOOD)
        else:
            self.say(f"✔ {verb}{where}: {len(diff)} change(s)", GOOD)
        if result.warning:
            self.say(f"✔ {verb}{where} · ⚠ {result.warning}", WARN)

    def report_failure(self, e: ApiError) -> None:
        if e.errors:
            self.show_errors(e.errors)
            self.say(f"✖ {len(e.errors)} error(s); the running policy is unchanged · Enter on one jumps to it", BAD)
        else:
            self.show_findings([])
            self.say(f"✖ {e.message}", BAD)

    def action_history(self) -> None:
        self.app.push_screen(HistoryScreen(self.client), self._rollback_chosen)

    def _rollback_chosen(self, version: int | None) -> None:
        if version is not None:
            self.rollback(version)

    @work(exclusive=True, group="policy")
    async def rollback(self, version: int) -> None:
        try:
            result = await reply(self, self.client.rollback(version))
            text = await reply(self, self.client.get_policy())
        except ApiError as e:
            self.report_failure(e)
            return
        self.loaded_text = text
        editor = self.query_one("#editor", TextArea)
        editor.load_text(text)
        editor.read_only = False
        self.mark_modified()
        self.show_result(result, f"rolled back to version {version}, stored")
