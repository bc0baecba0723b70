"""``fusekit.converter_hook``: fusekit's plan, passes and verification for
unchanged ``tf.lite.TFLiteConverter`` code.

    with fusekit.converter_hook():
        model = tf.lite.TFLiteConverter.from_saved_model(d).convert()

    fusekit.converter_hook.install()    # for a whole program

Under the hook, ``from_keras_model`` and ``from_concrete_functions`` are
routed through a SavedModel too (see sources.py), so their composites fuse.
The report lands on the converter as ``converter.fusekit_report``.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fusekit.conversion.sources import save_concrete_functions, save_keras


class _ConverterHook:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: dict[str, Any] = {}
        self.strict = True

    def __call__(self, strict: bool = True) -> contextlib.AbstractContextManager:
        return self._scope(strict)

    @contextlib.contextmanager
    def _scope(self, strict: bool) -> Iterator[None]:
        self.install(strict)
        try:
            yield
        finally:
            self.uninstall()

    @property
    def installed(self) -> bool:
        return self._depth > 0

    def install(self, strict: bool = True) -> None:
        """Hooks TFLiteConverter until uninstall() (nesting is counted)."""
        import tensorflow as tf

        with self._lock:
            self.strict = strict
            self._depth += 1
            if self._depth > 1:
                return
            cls = tf.lite.TFLiteConverter
            for name in ("from_saved_model", "from_keras_model", "from_concrete_functions"):
                self._saved[name] = cls.__dict__[name]
            cls.from_saved_model = classmethod(_from_saved_model(self))
            cls.from_keras_model = classmethod(_from_keras_model(self))
            cls.from_concrete_functions = classmethod(_from_concrete_functions(self))

    def uninstall(self) -> None:
        import tensorflow as tf

        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth:
                return
            for name, original in self._saved.items():
                setattr(tf.lite.TFLiteConverter, name, original)
            self._saved.clear()

    def original(self, name: str) -> Any:
        return self._saved[name].__func__


converter_hook = _ConverterHook()


def _wrap_convert(hook: _ConverterHook, converter: Any, saved_model_dir: str) -> None:
    from fusekit.conversion.converter import add_calibration_kernels, converter_error, finish
    from fusekit.conversion.plan import inspect

    original = converter.convert
    converter._fusekit_original_convert = original

    def convert() -> bytes:
        seconds: dict[str, float] = {}
        start = time.perf_counter()
        plan = inspect(saved_model_dir)
        seconds["plan"] = time.perf_counter() - start
        add_calibration_kernels(converter, plan)
        start = time.perf_counter()
        try:
            model = original()
        except Exception as exc:  # noqa: BLE001 - re-raised with the composite named
            raise converter_error(exc, plan) from exc
        seconds["convert"] = time.perf_counter() - start
        model, report = finish(model, plan, hook.strict, seconds)
        converter.fusekit_report = report
        converter.fusekit_plan = plan
        return model

    converter.convert = convert


def _from_saved_model(hook: _ConverterHook):
    def from_saved_model(cls, saved_model_dir, signature_keys=None, tags=None):
        converter = hook.original("from_saved_model")(cls, saved_model_dir, signature_keys, tags)
        _wrap_convert(hook, converter, str(saved_model_dir))
        return converter

    return from_saved_model


def _via_saved_model(hook: _ConverterHook, cls: Any, save) -> Any:
    tmp = tempfile.TemporaryDirectory(prefix="fusekit-hook-")
    path = Path(tmp.name) / "saved_model"
    save(path)
    converter = hook.original("from_saved_model")(cls, str(path))
    converter._fusekit_tmp = tmp  # lives as long as the converter
    _wrap_convert(hook, converter, str(path))
    return converter


def _from_keras_model(hook: _ConverterHook):
    def from_keras_model(cls, model):
        return _via_saved_model(hook, cls, lambda p: save_keras(model, p))

    return from_keras_model


def _from_concrete_functions(hook: _ConverterHook):
    def from_concrete_functions(cls, funcs, trackable_obj=None):
        return _via_saved_model(hook, cls, lambda p: save_concrete_functions(list(funcs), p))

    return from_concrete_functions
