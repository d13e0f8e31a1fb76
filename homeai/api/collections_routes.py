"""Who may search which collection.

    GET /v1/collections                  the collections the caller may search: name, owner, readers
    PUT /v1/collections/{name}/readers   {"users": ["alice", "*"]}: who else may search (owner or admin)

A collection belongs to the user whose index job built it (``POST /v1/jobs`` records the owner); its
owner, the users it lists (``*``: anyone with a key) and admins may search it. Without keys on
loopback everyone is an admin, so a household that set up nothing sees no difference. A collection the
caller may not search is answered exactly as one that does not exist (404), so names cannot be probed.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Router, get, put
from litestar.params import FromPath, JSONBody

from homeai.api.auth import Caller, resolve_caller
from homeai.api.errors import ApiError, NotFound, ServiceUnavailable
from homeai.api.services import Injected
from homeai.store.collections import CollectionAccess, Collections
from homeai.store.db import Store

UserName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class ReadersUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    users: Annotated[list[UserName], msgspec.Meta(max_length=256)]


class CollectionView(msgspec.Struct):
    name: str
    owner: str | None
    readers: list[str]


class CollectionList(msgspec.Struct):
    collections: list[CollectionView]


def _collections(store: Store | None) -> Collections:
    if store is None:
        raise ServiceUnavailable("collections are not available (no store, or still starting)")
    return store.collections


def _view(access: CollectionAccess) -> CollectionView:
    return CollectionView(access.name, access.owner, list(access.readers))


def no_collection(name: str, param: str) -> NotFound:
    """The one answer for a collection that is not there and for one the caller may not see."""
    return NotFound(f"no collection named {name!r}", param=param)


async def searchable(request: Request[Any, Any, Any], store: Store | None, name: str) -> CollectionAccess:
    """The collection ``name`` if the caller may search it; 404 if there is none or they may not."""
    access = await _collections(store).access(name)
    caller: Caller = await resolve_caller(request)
    if access is None or not access.may_search(caller.user, caller.is_admin):
        raise no_collection(name, "collection")
    return access


@get("/collections", summary="The collections the caller may search")
async def list_collections(request: Request[Any, Any, Any], store: Injected[Store | None]) -> CollectionList:
    caller = await resolve_caller(request)
    every = await _collections(store).all_access()
    return CollectionList([_view(a) for a in every if a.may_search(caller.user, caller.is_admin)])


@put("/collections/{name:str}/readers", status_code=200, summary="Set who else may search a collection")
async def set_readers(request: Request[Any, Any, Any], store: Injected[Store | None], name: FromPath[str],
                      data: JSONBody[ReadersUpdate]) -> CollectionView:
    collections = _collections(store)
    access = await collections.access(name)
    caller = await resolve_caller(request)
    if access is None or not access.may_search(caller.user, caller.is_admin):
        raise no_collection(name, "name")
    if not (caller.is_admin or caller.user == access.owner):  # a reader knows it exists
        raise ApiError(f"only the owner of {name!r} or an admin may change who searches it", status_code=403)
    users = [u.strip() for u in data.users if u.strip()]
    await collections.set_readers(access.id, users)
    updated = await collections.access(name)
    assert updated is not None
    return _view(updated)


collections_router = Router(path="/v1", route_handlers=[list_collections, set_readers], tags=["jobs"])
