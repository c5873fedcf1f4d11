"""`docqa rename` and `docqa rm`: thin commands over `Store.rename` / `Store.remove`,
registered on the main app by `register(app)`."""

from __future__ import annotations

from typing import Annotated

import typer

from .clikit import cli_errors, db_option, err, json_option, open_store, out, print_json, printable


def rename(
    doc: Annotated[str, typer.Argument(help="Doc id (or prefix) or an ingested path.", metavar="DOC")],
    title: Annotated[str, typer.Argument(help="The new title.", metavar="TITLE")],
    db: db_option = None,
    as_json: json_option = False,
) -> None:
    """Give a document a title (shown by `docs`, reviews and exports).

    Example: docqa rename 3f2a9c01b7de "Acme–Beta supply agreement 2021"
    """
    with open_store(db) as store:
        did = store.rename(doc, title)
        info = store.info(did)
    if as_json:
        print_json({"doc_id": did, "title": info.title})
    else:
        out.print(f"{did}  {printable(info.title)}")


def rm(
    doc: Annotated[str, typer.Argument(help="Doc id (or prefix) or an ingested path.", metavar="DOC")],
    db: db_option = None,
    as_json: json_option = False,
) -> None:
    """Remove a document: its pages, structure, passages, search entries, the runs asked of
    it alone, its citations in runs over several documents, and its cached KV.

    Example: docqa rm 3f2a9c01b7de
    """
    with open_store(db) as store:
        did = store.resolve(doc)
        sha256 = store.get_document(did).content_sha256
        removed = store.remove(did)
    removed["kv_files"] = drop_cached_kv(sha256)
    if as_json:
        print_json({"doc_id": did, "removed": removed})
    else:
        err.print(f"removed {did}: {removed['pages']} pages, {removed['passages']} passages, "
                  f"{removed['runs']} runs, {removed['citations_in_shared_runs']} citations in shared runs, "
                  f"{removed['kv_files']} cached KV files")


def drop_cached_kv(sha256: str) -> int:
    """Delete the per-document KV cache files of a document (any model, any settings): each
    file's metadata names the document content hash its prefix belongs to. Returns how many."""
    import json

    from safetensors import safe_open

    from ..engine.prefix_cache import default_cache_dir

    gone = 0
    for path in default_cache_dir().glob("*/*.safetensors"):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                owner = json.loads((f.metadata() or {}).get("namespace", "[]"))[:1]
        except Exception:  # unreadable or foreign: not ours to judge
            continue
        if owner == [sha256]:
            path.unlink(missing_ok=True)
            gone += 1
    return gone


def register(app: typer.Typer) -> None:
    app.command()(cli_errors(rename))
    app.command()(cli_errors(rm))
