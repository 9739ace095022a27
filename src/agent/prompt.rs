//! What the agent is told: the system prompt, the task prompt, and the three tools in the
//! OpenAI function format the chat template renders into the system turn.

use serde_json::{json, Value};

pub const SYSTEM_PROMPT: &str = "\
You are a software engineer working in a repository checked out at {workdir}. You solve the \
issue you are given by reading the code, running commands and editing files with the tools \
below, one or more tool calls per reply. Every bash command runs in a fresh shell in {workdir} \
with no network and a time limit; `cd` and variables do not carry over between commands. When \
the fix is complete, call `submit`.";

pub const TASK_PROMPT: &str = "\
<issue>
{problem_statement}
</issue>

The repository is at {workdir}. Make the smallest change to its source files that resolves the \
issue. Hidden tests will check the fix; you may write your own tests, but the hidden ones \
replace any test file of the same name. Call `submit` when you are done.";

pub fn system_prompt(workdir: &str) -> String {
    SYSTEM_PROMPT.replace("{workdir}", workdir)
}

pub fn task_prompt(problem_statement: &str, workdir: &str) -> String {
    TASK_PROMPT
        .replace("{workdir}", workdir)
        .replace("{problem_statement}", problem_statement.trim())
}

/// `bash`, `str_replace_editor` (SWE-agent's) and `submit`, as chat-template tools.
pub fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {
            "name": "bash",
            "description": "Run a shell command in the repository and return its output (stdout and stderr) and exit status. Long outputs are shortened in the middle.",
            "parameters": {"type": "object", "properties": {
                "command": {"type": "string", "description": "The command, run with sh -c."}
            }, "required": ["command"]}
        }}),
        json!({"type": "function", "function": {
            "name": "str_replace_editor",
            "description": "View, create and edit files. `view` shows a file with line numbers (or a folder two levels deep); `create` writes a new file; `str_replace` replaces old_str, which must occur exactly once, with new_str; `insert` adds new_str after line insert_line (0: at the top); `undo_edit` reverts the last edit of a file.",
            "parameters": {"type": "object", "properties": {
                "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
                "path": {"type": "string", "description": "Absolute path, or relative to the repository."},
                "file_text": {"type": "string", "description": "`create`: the file's content."},
                "old_str": {"type": "string", "description": "`str_replace`: the exact text to replace."},
                "new_str": {"type": "string", "description": "`str_replace`: the replacement (empty deletes); `insert`: the text to insert."},
                "insert_line": {"type": "integer", "description": "`insert`: the line after which new_str goes."},
                "view_range": {"type": "array", "items": {"type": "integer"}, "description": "`view`: [first, last] lines, 1-based; last -1 means the end."}
            }, "required": ["command", "path"]}
        }}),
        json!({"type": "function", "function": {
            "name": "submit",
            "description": "Finish: the repository as it is now is your answer.",
            "parameters": {"type": "object", "properties": {}}
        }}),
    ]
}
