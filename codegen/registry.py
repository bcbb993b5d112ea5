"""S20: keep the generated imports of a package ``__init__.py`` in step with the manifest.

The generated lines live in one block that starts with a grouping comment
(``# --- norm ops (generated) ---``).  ``register`` rewrites exactly that block
and the matching ``__all__`` entries with libcst; every other line of the file,
hand-written imports and comments included, is preserved.  Names the block
imported before but no longer lists are dropped from ``__all__`` too.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Set, Tuple

import libcst as cst

__all__ = ["register", "group_comment", "generated_names"]


def group_comment(group: str) -> str:
    return f"# --- {group} (generated) ---"


def _is_relative_import(statement: cst.CSTNode) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.ImportFrom) and len(statement.body[0].relative) > 0)


def _imported_names(statement: cst.SimpleStatementLine) -> List[str]:
    node = statement.body[0]
    assert isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar)
    return [alias.evaluated_alias or alias.evaluated_name for alias in node.names]


def _has_comment(statement: cst.CSTNode, comment: str) -> bool:
    leading = getattr(statement, "leading_lines", ())
    return any(line.comment is not None and line.comment.value.strip() == comment for line in leading)


def _find_block(body: Sequence[cst.CSTNode], comment: str) -> Optional[Tuple[int, int]]:
    """(start, end) indices of the generated block, end exclusive."""
    for start, statement in enumerate(body):
        if _has_comment(statement, comment):
            end = start
            while end < len(body) and _is_relative_import(body[end]) and (
                    end == start or not any(line.comment for line in body[end].leading_lines)):
                end += 1
            return start, end
    return None


def _is_all_assignment(statement: cst.CSTNode) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    node = statement.body[0]
    return (isinstance(node, cst.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0].target, cst.Name) and node.targets[0].target.value == "__all__")


def _all_entries(statement: cst.SimpleStatementLine) -> List[str]:
    value = statement.body[0].value
    if not isinstance(value, (cst.List, cst.Tuple)):
        raise ValueError("__all__ must be a list or tuple literal")
    entries = []
    for element in value.elements:
        if not isinstance(element.value, cst.SimpleString):
            raise ValueError("__all__ entries must be string literals")
        entries.append(element.value.evaluated_value)
    return entries


def _all_statement(entries: Sequence[str], leading: Sequence[cst.EmptyLine]) -> cst.SimpleStatementLine:
    if not entries:
        code = "__all__: list = []\n"
    else:
        code = "__all__ = [\n" + "".join(f'    "{e}",\n' for e in entries) + "]\n"
    statement = cst.parse_statement(code)
    return statement.with_changes(leading_lines=list(leading))


def generated_names(source: str, group: str) -> List[str]:
    """Names imported by the generated block of ``group`` in ``source``."""
    module = cst.parse_module(source)
    block = _find_block(module.body, group_comment(group))
    if block is None:
        return []
    names: List[str] = []
    for statement in module.body[block[0]:block[1]]:
        names += _imported_names(statement)
    return names


def register(source: str, group: str, imports: Sequence[Tuple[str, str]]) -> str:
    """Return ``source`` with the ``group`` block importing exactly ``imports``.

    ``imports`` holds (relative module, name) pairs such as (".rms_norm_fwd", "RMSNormFwdOp").
    """
    module = cst.parse_module(source)
    comment = group_comment(group)
    body = list(module.body)
    block = _find_block(body, comment)
    old_names: Set[str] = set()
    if block is not None:
        for statement in body[block[0]:block[1]]:
            old_names.update(_imported_names(statement))
        leading = list(body[block[0]].leading_lines)
        del body[block[0]:block[1]]
        insert_at = block[0]
    else:
        leading = [cst.EmptyLine(), cst.EmptyLine(comment=cst.Comment(comment))]
        insert_at = _after_imports(body)
    new_statements = []
    for index, (rel_module, name) in enumerate(sorted(imports)):
        statement = cst.parse_statement(f"from {rel_module} import {name}\n")
        if index == 0:
            statement = statement.with_changes(leading_lines=leading)
        new_statements.append(statement)
    if not new_statements and block is not None:
        # Keep the grouping comment so a later op lands in the same place.
        new_statements = []
    body[insert_at:insert_at] = new_statements
    body = _update_all(body, old_names, [name for _, name in sorted(imports)])
    return module.with_changes(body=body).code


def _after_imports(body: Sequence[cst.CSTNode]) -> int:
    position = 0
    for index, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine) and isinstance(
                statement.body[0], (cst.Import, cst.ImportFrom, cst.Expr)):
            position = index + 1
        elif _is_all_assignment(statement):
            break
    return position


def _update_all(body: List[cst.CSTNode], old_names: Set[str], new_names: Sequence[str]) -> List[cst.CSTNode]:
    for index, statement in enumerate(body):
        if _is_all_assignment(statement):
            kept = [e for e in _all_entries(statement) if e not in old_names or e in new_names]
            entries = kept + [n for n in new_names if n not in kept]
            if entries != _all_entries(statement):
                body[index] = _all_statement(entries, statement.leading_lines)
            return body
    body.append(_all_statement(list(new_names), [cst.EmptyLine()]))
    return body
