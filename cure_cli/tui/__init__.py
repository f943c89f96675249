"""The Textual TUI: `cure chat` (live decoding) and `cure inspect` (step through a trace).

Modules: `tokens` (token ids -> readable text), `engine_protocol` (what the chat app drives: a
real Engine, or a replay of a trace), `messages` (worker -> UI), `widgets` (Repair tree, Margins,
Stats, coloured answer text), `turns` (one chat turn: Markdown / origin view, note, comparisons),
`app_chat`, `app_inspect`. Saved chats: cure_cli/chat_sessions.py.
"""
