"""Assistant-only loss masks for several chat templates (issue 2, must-show item 2).

For each template, decoding the masked tokens of a multi-turn conversation with a system prompt
must give back exactly the assistant messages as the template renders them (plus the
end-of-turn token where the template has one), and nothing from the user or system turns.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from draftsmith.data.chat import renderer, tokenize_conversation, tokenize_conversations, turn_markers
from draftsmith.errors import UserError
from tests.helpers import masked_runs

ASSETS = Path(__file__).parents[1] / "assets"

LLAMA3 = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = 'Cutting Knowledge Date: December 2023' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message + '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Qwen3's template, reduced to its message logic: <think> is kept only for turns after the last
# user query and stripped from earlier assistant turns.
QWEN3 = """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == "user" %}{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == "user" or message.role == "system" %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
{%- elif message.role == "assistant" %}{%- set content = message.content %}{%- set reasoning_content = '' %}
{%- if '</think>' in message.content %}{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
{%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}{%- endif %}
{%- if loop.index0 > ns.last_query_index %}
{%- if loop.last or (not loop.last and reasoning_content) %}{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}
{{- '<|im_end|>\\n' }}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"""

# Mistral-style: no assistant header at all (generation prompt is empty), eos ends a reply.
INST = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>{{ m['content'] }}<</SYS>>"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)

# DeepSeek-R1-style: the generation prompt opens a <think> block that rendered turns do not
# have, and every turn's reasoning is stripped.
R1 = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}{% else %}{% set c = m['content'] %}"
    "{% if '</think>' in c %}{% set c = c.split('</think>')[-1] %}{% endif %}"
    "{{ '<｜Assistant｜>' + c + '<｜end▁of▁sentence｜>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
)

SYSTEM, U1, A1, U2 = "You are a terse math tutor.", "What is 2+3?", "2+3 = 5.", "And times 4?"
A2 = "<think>\nMultiply the sum by four.\n</think>\n\n(2+3)*4 = 20."
CONV = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": U1},
    {"role": "assistant", "content": A1},
    {"role": "user", "content": U2},
    {"role": "assistant", "content": A2},
]


def make_tokenizer(template: str | None = None):
    tok = AutoTokenizer.from_pretrained(ASSETS / "smollm2_tokenizer")
    if template is R1:
        tok.add_tokens(["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"], special_tokens=True)
    if template is LLAMA3:
        tok.add_tokens(
            ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], special_tokens=True
        )
        tok.bos_token = "<|begin_of_text|>"
    if template is not None:
        tok.chat_template = template
    return tok


def unmasked_text(tok, ids: list[int], mask: list[int]) -> str:
    return tok.decode([i for i, m in zip(ids, mask) if not m])


@pytest.mark.parametrize(
    "name,template,expected",
    [
        ("smollm2 (embedded default)", None, [A1 + "<|im_end|>", A2 + "<|im_end|>"]),
        ("llama3 headers, trims content", LLAMA3, [A1 + "<|eot_id|>", A2 + "<|eot_id|>"]),
        ("qwen3 thinking", QWEN3, [A1 + "<|im_end|>", A2 + "<|im_end|>"]),
        (
            "deepseek-r1: prompt opens <think>",
            R1,
            [A1 + "<｜end▁of▁sentence｜>", "\n\n(2+3)*4 = 20.<｜end▁of▁sentence｜>"],
        ),
        ("no header (prefix-render path)", INST, [" " + A1 + "<|im_end|>", " " + A2 + "<|im_end|>"]),
    ],
)
def test_mask_decodes_to_exactly_the_assistant_turns(name, template, expected):
    tok = make_tokenizer(template)
    ids, mask = tokenize_conversation(tok, CONV)
    assert ids == tok(renderer(tok)(CONV), add_special_tokens=False)["input_ids"]  # the template's own tokens
    assert masked_runs(tok, ids, mask) == expected
    rest = unmasked_text(tok, ids, mask)
    for text in (SYSTEM, U1, U2):
        assert text in rest
    assert A1 not in rest and "20." not in rest


def test_default_system_prompt_injected_by_template_is_not_masked():
    tok = make_tokenizer()  # SmolLM2's template adds "You are a helpful AI assistant named SmolLM..."
    conv = CONV[1:]
    ids, mask = tokenize_conversation(tok, conv)
    assert masked_runs(tok, ids, mask) == [A1 + "<|im_end|>", A2 + "<|im_end|>"]
    assert "SmolLM" in unmasked_text(tok, ids, mask)


def test_qwen3_history_turn_keeps_only_what_the_template_renders():
    tok = make_tokenizer(QWEN3)
    a1 = "<think>\nadd them\n</think>\n\n2+3 = 5."  # earlier turn: the template strips the think block
    conv = [CONV[0], CONV[1], {"role": "assistant", "content": a1}, CONV[3], CONV[4]]
    ids, mask = tokenize_conversation(tok, conv)
    assert masked_runs(tok, ids, mask) == ["2+3 = 5.<|im_end|>", A2 + "<|im_end|>"]
    assert "add them" not in tok.decode(ids)


def test_user_quoting_the_assistant_header_falls_back_to_prefix_renders():
    tok = make_tokenizer()
    conv = [
        {"role": "user", "content": "Explain '<|im_start|>assistant\n' please"},
        {"role": "assistant", "content": "It opens a reply."},
    ]
    ids, mask = tokenize_conversation(tok, conv)
    assert masked_runs(tok, ids, mask) == ["It opens a reply.<|im_end|>"]


def test_markers_are_read_from_the_template():
    tok = make_tokenizer()
    m = turn_markers(tok, renderer(tok))
    assert (m.header, m.eot) == ("<|im_start|>assistant\n", "<|im_end|>")
    llama = make_tokenizer(LLAMA3)
    m = turn_markers(llama, renderer(llama))
    assert (m.header, m.eot) == ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")
    r1 = make_tokenizer(R1)
    m = turn_markers(r1, renderer(r1))
    assert (m.header, m.eot) == ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")  # not the prompt's "<think>\n"


@pytest.mark.parametrize("template", [None, LLAMA3, QWEN3, R1])
def test_renderer_matches_apply_chat_template(template):
    tok = make_tokenizer(template)
    render = renderer(tok)
    for gen in (False, True):
        assert render(CONV, gen) == tok.apply_chat_template(CONV, tokenize=False, add_generation_prompt=gen)


def test_batched_equals_single():
    tok = make_tokenizer()
    convs = [CONV, CONV[1:3], [CONV[1], {"role": "assistant", "content": ""}]]
    batched = tokenize_conversations(tok, convs)
    for conv, (ids, mask) in zip(convs, batched):
        assert (ids.tolist(), mask.tolist()) == tokenize_conversation(tok, conv)
    assert masked_runs(tok, *map(list, batched[2])) == ["<|im_end|>"]  # an empty reply still ends its turn


def test_no_chat_template_names_the_flag():
    tok = make_tokenizer()
    tok.chat_template = None
    with pytest.raises(UserError, match="--chat-template"):
        tokenize_conversation(tok, CONV)


def test_no_assistant_turn_is_an_error_naming_the_sample():
    tok = make_tokenizer()
    with pytest.raises(UserError, match="data.jsonl sample line-3: conversation has no assistant turn"):
        tokenize_conversations(tok, [CONV, CONV[:2]], names=["data.jsonl sample line-1", "data.jsonl sample line-3"])
