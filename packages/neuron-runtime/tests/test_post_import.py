"""Post-import hooks (``neuron_runtime._post_import``), which neuron-hf's fixes and neuron-compile's
Dynamo patch ride on: run after the module body, at once for imported modules, later for
half-imported ones."""

from __future__ import annotations


def _fake_package(tmp_path, monkeypatch, name: str, body: str = "VALUE = 1\n") -> None:
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_hook_runs_after_the_module_body_and_before_the_importer_sees_it(tmp_path, monkeypatch):
    from neuron_runtime._post_import import register_post_import_hook

    _fake_package(tmp_path, monkeypatch, "npi_fake_a")
    seen = []
    register_post_import_hook("npi_fake_a.mod", lambda m: (seen.append(m.VALUE), setattr(m, "VALUE", 2)))
    from npi_fake_a.mod import VALUE  # noqa: PLC0415 - bound after the hook patched it

    assert seen == [1] and VALUE == 2
    import npi_fake_a.mod

    assert npi_fake_a.mod.__loader__.get_source("npi_fake_a.mod") == "VALUE = 1\n"  # loader still usable


def test_hook_on_an_imported_module_runs_at_once(tmp_path, monkeypatch):
    from neuron_runtime._post_import import register_post_import_hook

    _fake_package(tmp_path, monkeypatch, "npi_fake_b")
    import npi_fake_b.mod

    register_post_import_hook("npi_fake_b.mod", lambda m: setattr(m, "VALUE", 3))
    assert npi_fake_b.mod.VALUE == 3


def test_hook_on_a_half_imported_module_waits_for_it_to_finish(tmp_path, monkeypatch):
    """The module that first imports torch is mid-import when the entry point arms the hooks."""
    body = (
        "from neuron_runtime._post_import import register_post_import_hook\n"
        "register_post_import_hook('npi_fake_c.mod', lambda m: setattr(m, 'VALUE', m.VALUE + 10))\n"
        "VALUE = 1\n"
    )
    _fake_package(tmp_path, monkeypatch, "npi_fake_c", body)
    (tmp_path / "npi_fake_c_trigger.py").write_text("")
    import npi_fake_c.mod

    assert npi_fake_c.mod.VALUE == 1  # not run on the half-built module
    import npi_fake_c_trigger  # noqa: F401 - any later import flushes the pending hooks

    assert npi_fake_c.mod.VALUE == 11
