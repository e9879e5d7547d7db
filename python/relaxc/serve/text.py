"""Text for an LLM replica: the model's tokenizer (Hugging Face's tokenizer.json, read with the
`tokenizers` library), its chat template (tokenizer_config.json, rendered with Jinja the way
transformers renders it) and the text of a sequence as its tokens stream in. Detokenizing is
incremental, so a character whose bytes span tokens comes out once, whole; text that could still
grow into a stop string is held back until it cannot."""

import json
import os


class TokenizerError(ValueError):
    """A tokenizer or its configuration that cannot be used, with the file named."""


def _token_text(value):
    # tokenizer_config.json writes special tokens as strings or as AddedToken objects.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def config_path_for(tokenizer_path):
    """Where the tokenizer's configuration is looked for: NAME.tokenizer_config.json beside
    NAME.tokenizer.json (as `python -m relaxc.llm build` writes them), else
    tokenizer_config.json in the same folder (as Hugging Face's repositories hold it)."""
    folder, base = os.path.split(tokenizer_path)
    candidates = []
    if base.endswith(".tokenizer.json"):
        candidates.append(os.path.join(folder, base[: -len("tokenizer.json")] + "tokenizer_config.json"))
    candidates.append(os.path.join(folder, "tokenizer_config.json"))
    return next((c for c in candidates if os.path.isfile(c)), None)


class Tokenizer:
    """A model's tokenizer with its special tokens and chat template."""

    def __init__(self, path, config_path=None):
        from tokenizers import Tokenizer as HuggingFaceTokenizer

        try:
            self.hf = HuggingFaceTokenizer.from_file(path)
        except Exception as e:
            raise TokenizerError(f"{path}: not a tokenizer.json that can be read: {e}") from None
        self.path = path
        config_path = config_path or config_path_for(path)
        config = {}
        if config_path:
            try:
                with open(config_path, encoding="utf-8") as f:
                    config = json.load(f)
            except (OSError, ValueError) as e:
                raise TokenizerError(f"{config_path}: {e}") from None
            if not isinstance(config, dict):
                raise TokenizerError(f"{config_path}: not a JSON object")
        self.config_path = config_path
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        self.chat_template = template if isinstance(template, str) else None
        eos = self.hf.token_to_id(self.eos_token) if self.eos_token else None
        self.eos_ids = {eos} if eos is not None else set()
        self._template = None

    def encode(self, text, special=True):
        """Token ids of `text`; `special` adds what the tokenizer adds around a text (a BOS)."""
        return self.hf.encode(text, add_special_tokens=special).ids

    def decode(self, ids):
        return self.hf.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, messages):
        """The prompt text of a chat: the template rendered with the messages and the
        generation prompt, as transformers' apply_chat_template(add_generation_prompt=True)."""
        if self.chat_template is None:
            where = self.config_path or f"no tokenizer_config.json beside {self.path}"
            raise TokenizerError(f"the tokenizer has no chat_template ({where})")
        if self._template is None:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message):
                raise jinja2.exceptions.TemplateError(message)

            def strftime_now(fmt):
                import datetime

                return datetime.datetime.now().strftime(fmt)

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True,
                lstrip_blocks=True,
                extensions=["jinja2.ext.loopcontrols"],
            )
            env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
            env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
            try:
                self._template = env.from_string(self.chat_template)
            except jinja2.exceptions.TemplateError as e:
                raise TokenizerError(f"the chat template does not parse: {e}") from None
        return self._template.render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def stream(self, stops=()):
        return TextStream(self, stops)


class TextStream:
    """The text of one sequence as its tokens come: `push` returns the new text that is final and
    whether a stop string was reached (the text ends before it); `flush` gives what was held."""

    def __init__(self, tokenizer, stops=()):
        from tokenizers.decoders import DecodeStream

        self.hf = tokenizer.hf
        self.decoder = DecodeStream(skip_special_tokens=True)
        self.stops = [s for s in stops if s]
        self.held = ""

    def push(self, token):
        piece = self.decoder.step(self.hf, token) or ""
        text = self.held + piece
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.held = ""
            return text[: min(found)], True
        # Hold back the longest end of the text that begins some stop string: everything before
        # it can never become part of one.
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:n]):
                    keep = n
                    break
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self):
        text, self.held = self.held, ""
        return text
