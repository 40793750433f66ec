"""The shared local cache behind the Kubernetes boundary: list once, then watch (issue 29).

An `Informer` keeps the objects of one collection (`Collection`: a path and its selectors)
as the apiserver last said they are. It lists them once, then watches from that List's
resourceVersion with bookmarks (``allowWatchBookmarks``) and applies each event: ADDED and
MODIFIED store the object, DELETED removes it, a BOOKMARK only moves the resourceVersion
on. When a watch ends (the apiserver's timeout, a connection broken by an apiserver
restart) the next one starts from the last resourceVersion seen, after a back-off if it
broke; only ``410 Gone`` (that resourceVersion was compacted away) lists again. The
resourceVersion never goes back: an event older than the cache is dropped. A collection
this identity may list but not watch (403 on `REFUSALS` watches in a row: a restarted
apiserver refuses for a moment) is listed again every ``poll_s`` instead, a watch tried
again every minute; one it may not list at first is `Informer.forbidden` (readers fall
back).

`Cache` is the one place a process keeps them: one informer per collection, shared by
every reader (the backend's follower thread, its capacity, the node agents' addresses;
the operator's Simulations; the node agent's rank pods), each watched on a thread of its
own. The official client gives the watch stream (`client.ClientKubeApi.watch`) but no
informer, and no maintained Python library offers one over plain JSON (kopf's watching is
internal to its framework; lightkube and kr8s watch but keep no cache): this is client-go's
reflector and store, reduced to what rankpack reads. Tests drive a cache without threads
(``background=False``): every read does one round (`Informer.pump`) first.

Readers get the objects as the apiserver sent them and must not change them.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rankpack.backend.kubernetes.api.kubeapi import ApiError, Gone, KubeApi, Obj

log = logging.getLogger("rankpack.kubernetes")

WATCH_S = 300.0
"""A watch asks the apiserver to end it after between this and twice this (client-go: 5 to
10 minutes), so that watches of many clients do not all start again at once."""
BACKOFF_S = (0.5, 5.0)
"""The first and the longest wait before a broken watch (or a failed List) is tried again."""

REFUSALS = 5
"""Watches refused (403) in a row, backed off, before the collection is listed instead."""
REWATCH_S = 60.0
"""A collection listed instead of watched tries a watch again this often."""
Listener = Callable[[str, Obj], None]
"""Called with each change the cache takes in: ``(ADDED | MODIFIED | DELETED, object)``."""


@dataclass(frozen=True)
class Collection:
    """What one informer lists and watches: a collection's path and its selectors."""

    path: str
    """``/api/v1/namespaces/NS/pods``, ``/api/v1/nodes``, ``/apis/G/V/namespaces/NS/R``."""
    label_selector: str = ""
    field_selector: str = ""

    def query(self) -> dict[str, str]:
        return {k: v for k, v in (("labelSelector", self.label_selector),
                                  ("fieldSelector", self.field_selector)) if v}  # fmt: skip

    def __str__(self) -> str:
        sel = ",".join(s for s in (self.label_selector, self.field_selector) if s)
        return f"{self.path}?{sel}" if sel else self.path


def core(resource: str, namespace: str | None = None, *, labels: str = "",
         fields: str = "") -> Collection:  # fmt: skip
    """A core/v1 collection, of one namespace or (None) of the cluster."""
    where = f"/namespaces/{namespace}" if namespace else ""
    return Collection(f"/api/v1{where}/{resource}", labels, fields)


def selected(obj: Obj, label_selector: str) -> bool:
    """Whether the object's labels match an equality selector (``a=b,c``: ``c`` exists)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, label_selector.split(",")):
        key, eq, value = term.partition("=")
        if (eq and labels.get(key) != value) or (not eq and key not in labels):
            return False
    return True


def key_of(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def version_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def newer(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is later than ``b``. The API calls them opaque; every
    apiserver gives etcd's revision, an integer, and the cache compares them only to never
    go back. One that is not an integer is taken as later than any other."""
    if not b:
        return bool(a)
    try:
        return int(a) > int(b)
    except ValueError:
        return bool(a) and a != b


@dataclass
class InformerStats:
    """What an informer did (and so what it cost the apiserver: `lists` + `watches`)."""

    lists: int = 0
    watches: int = 0
    """Watch requests opened (each ends after ~``WATCH_S`` or when it breaks)."""
    gone: int = 0
    """Watches answered ``410 Gone``: each cost one List again."""
    broken: int = 0
    """Watches or Lists that failed without an answer (apiserver restarted, unreachable)."""
    events: int = 0
    bookmarks: int = 0
    dropped: int = 0
    """Events older than the cache (never applied: the resourceVersion only moves on)."""


@dataclass
class Informer:
    """One collection's objects, listed once and then watched (see the module doc)."""

    api: KubeApi
    collection: Collection
    poll_s: float = 5.0
    """How often a collection that may be listed but not watched is listed again."""
    watch_s: float = WATCH_S
    rng: random.Random = field(default_factory=random.Random)
    listeners: list[Listener] = field(default_factory=list)
    stats: InformerStats = field(default_factory=InformerStats)
    resource_version: str = ""
    """The latest resourceVersion the cache has taken in (a List's, an event's, a
    bookmark's): where the next watch starts."""
    synced: bool = False
    """Listed at least once: `items` answers (possibly stale while `error` says why)."""
    forbidden: bool = False
    """This identity may not list the collection (403): readers use their fallback."""
    error: str | None = None
    """Why the last watch or List failed (None: the watch is open, or the last call
    answered)."""
    version: int = 0
    """Changes taken in so far (`wait` returns when it moves)."""
    _objs: dict[str, Obj] = field(default_factory=dict)
    _relist: bool = True
    _watchable: bool = True
    _refused: int = 0
    """Watches refused (403) in a row."""
    _rewatch_at: float = 0.0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _list_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while the first List runs (readers that arrive meanwhile wait for it)."""

    # -- readers ------------------------------------------------------------------------

    def items(self) -> list[Obj]:
        """The objects (not to be changed), in no particular order."""
        with self._cond:
            return list(self._objs.values())

    def get(self, name: str, namespace: str = "") -> Obj | None:
        with self._cond:
            return self._objs.get(f"{namespace}/{name}")

    def caught_up(self, resource_version: str | None) -> bool:
        """The cache has taken in every change up to ``resource_version`` (a write's
        answer): an object created then that is not in it now is gone."""
        with self._cond:
            return not resource_version or not newer(resource_version, self.resource_version)

    def wait(self, seen: int, timeout_s: float) -> int:
        """Until a change after ``seen`` (a `version`) is taken in, or ``timeout_s``; the
        version then."""
        with self._cond:
            if self.version == seen:
                self._cond.wait(timeout_s)
            return self.version

    # -- the apiserver side -------------------------------------------------------------

    def list_now(self) -> None:
        """List the collection and take it as the cache (a 403 makes it `forbidden`)."""
        self.stats.lists += 1
        try:
            found = self.api.list_collection(self.collection.path, self.collection.query())
        except ApiError as exc:
            if exc.status == 403 and not self.synced:  # (once listed: a restart's refusal)
                self.forbidden, self.synced, self._relist = True, True, False
                self._changed([])
            raise
        items = list(found.get("items") or [])
        rv = str((found.get("metadata") or {}).get("resourceVersion") or "")
        kind = str(found.get("kind") or "").removesuffix("List")
        changes: list[tuple[str, Obj]] = []
        with self._cond:
            new: dict[str, Obj] = {}
            for obj in items:
                if kind and "kind" not in obj:  # a List's items do not say their kind
                    obj["kind"] = kind
                new[key_of(obj)] = obj
            for key, gone in self._objs.items():
                if key not in new:
                    changes.append(("DELETED", gone))
            for key, obj in new.items():
                old = self._objs.get(key)
                if old is None:
                    changes.append(("ADDED", obj))
                elif old != obj:
                    changes.append(("MODIFIED", obj))
            self._objs = new
            self.resource_version = rv  # a List's version: the newest there is
            self.synced, self.forbidden, self._relist, self.error = True, False, False, None
        self._changed(changes, always=True)

    def watch_once(self, stop: threading.Event | None = None) -> int:
        """One watch from `resource_version`, its events applied until it ends (the
        apiserver's timeout; an error raises: `Gone` means list again). Returns how many
        events it brought."""
        timeout = self.watch_s * (1.0 + self.rng.random())
        query: Mapping[str, str] = {**self.collection.query(), "allowWatchBookmarks": "true",
                                    "resourceVersion": self.resource_version}  # fmt: skip
        self.stats.watches += 1
        stream = self.api.watch(self.collection.path, query=query, timeout_s=timeout)
        self.error = None
        n = 0
        try:
            for event in stream:
                n += 1
                self.apply(event)
                if stop is not None and stop.is_set():
                    break
        finally:
            _close(stream)
        return n

    def apply(self, event: Obj) -> None:
        """Take one watch event in (see the module doc)."""
        kind = str(event.get("type") or "")
        obj = event.get("object") or {}
        rv = version_of(obj)
        if kind == "BOOKMARK":
            with self._cond:
                self.stats.bookmarks += 1
                if newer(rv, self.resource_version):
                    self.resource_version = rv
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        with self._cond:
            if rv and self.resource_version and newer(self.resource_version, rv):
                self.stats.dropped += 1  # older than what the cache holds: never go back
                return
            self.stats.events += 1
            key = key_of(obj)
            held = self._objs.get(key)
            if newer(rv, self.resource_version):
                self.resource_version = rv
            if held is not None and kind != "DELETED" and newer(version_of(held), rv):
                return  # this process's own write (`saw`) got here first
            if kind == "DELETED":
                self._objs.pop(key, None)
            else:
                self._objs[key] = obj
        self._changed([(kind, obj)])

    def saw(self, obj: Obj) -> None:
        """An object as this process's own write returned it: held at once if it is newer
        than the cache's copy (read your writes), ahead of its watch event. Where the watch
        resumes does not move: events up to it are still to come."""
        rv = version_of(obj)
        with self._cond:
            held = self._objs.get(key_of(obj))
            if held is None or not rv or not newer(rv, version_of(held)):
                return
            self._objs[key_of(obj)] = obj
        self._changed([("MODIFIED", obj)])

    def _changed(self, changes: list[tuple[str, Obj]], *, always: bool = False) -> None:
        if not changes and not always:
            return
        with self._cond:
            self.version += 1
            self._cond.notify_all()
        for kind, obj in changes:
            for listener in list(self.listeners):
                listener(kind, obj)

    def pump(self) -> None:
        """One round without waiting (tests, ``background=False``): list if due, else one
        watch; a `Gone` lists again at once; other errors are kept in `error`."""
        try:
            self._round(None)
        except Gone:
            self.stats.gone += 1
            self._relist = True
            try:
                self._round(None)
            except ApiError as exc:
                self.error = str(exc)
        except ApiError as exc:
            self.error = str(exc)

    def _round(self, stop: threading.Event | None) -> None:
        if self._relist:
            self.list_now()
        elif not self._watchable and time.monotonic() < self._rewatch_at:
            self.list_now()  # may list, may not watch: the List is the poll
        else:
            self._watchable = True
            try:
                t0 = time.monotonic()
                if self.watch_once(stop) == 0 and time.monotonic() - t0 < 1.0 and stop:
                    # ended at once with nothing (client-go's "very short watch"): not
                    # opened again in a tight loop
                    raise ApiError(0, "ShortWatch", "the watch ended at once without events")
            except ApiError as exc:
                if exc.status != 403:
                    raise
                # an apiserver that has just started refuses until its authorizer has
                # synced: a few refusals in a row are backed off like a broken watch
                self._refused += 1
                if self._refused < REFUSALS:
                    raise
                log.warning("watch on %s refused (%s): listing it every %.0f s instead",
                            self.collection, exc, self.poll_s)  # fmt: skip
                self._watchable = False
                self._rewatch_at = time.monotonic() + REWATCH_S
            else:
                self._refused = 0

    def run(self, stop: threading.Event) -> None:
        """Watch until ``stop`` (the informer's thread): watches follow each other from the
        last resourceVersion, with back-off after a failure; `Gone` lists again."""
        delay = BACKOFF_S[0]
        while not stop.is_set():
            if self.forbidden:
                return
            try:
                self._round(stop)
            except Gone:
                self.stats.gone += 1
                self._relist = True
                log.info("watch on %s: resourceVersion %s is gone; listing again",
                         self.collection, self.resource_version)  # fmt: skip
                continue
            except (ApiError, ValueError) as exc:  # unreachable, 5xx, a broken stream
                self.stats.broken += 1
                self.error = str(exc)
                log.info("watch on %s: %s; again in %.1f s", self.collection, exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, BACKOFF_S[1])
                continue
            except Exception as exc:  # a bug must not leave the cache stale for good
                self.stats.broken += 1
                self.error = repr(exc)
                self._relist = True
                log.warning("watch on %s failed: %r; listing again in %.1f s",
                            self.collection, exc, delay)  # fmt: skip
                stop.wait(delay)
                delay = min(delay * 2, BACKOFF_S[1])
                continue
            delay = BACKOFF_S[0]
            if not self._watchable:
                stop.wait(self.poll_s)


def _close(stream: Iterator[Obj]) -> None:
    close: Any = getattr(stream, "close", None)
    if close is not None:
        close()


class Cache:
    """The informers of one process, shared by every reader (see the module doc)."""

    def __init__(self, api: KubeApi, *, background: bool = True, poll_s: float = 5.0) -> None:
        self.api = api
        self.background = background
        self.poll_s = poll_s
        self.stop = threading.Event()
        self._informers: dict[Collection, Informer] = {}
        self._threads: dict[Collection, threading.Thread] = {}
        self._lock = threading.Lock()

    def informer(self, collection: Collection) -> Informer:
        """The collection's informer, listed (here, the first time: an error raises, and
        the next call lists again; a 403 makes it `Informer.forbidden`) and watched from
        then on by a thread of its own (without one: one round per call)."""
        with self._lock:
            inf = self._informers.get(collection)
            if inf is None:
                inf = Informer(self.api, collection, poll_s=self.poll_s)
                self._informers[collection] = inf
        if not inf.synced:
            with inf._list_lock:
                if not inf.synced:
                    try:
                        inf.list_now()
                    except ApiError as exc:
                        if exc.status != 403:
                            raise
            if self.background and not inf.forbidden:
                self._start(collection, inf)
            return inf
        if not self.background:
            inf.pump()
        elif not inf.forbidden and not self.stop.is_set():
            self._start(collection, inf)  # (cheap when its thread runs)
        return inf

    def _start(self, collection: Collection, inf: Informer) -> None:
        with self._lock:
            thread = self._threads.get(collection)
            if thread is not None and thread.is_alive():
                return
            thread = threading.Thread(target=inf.run, args=(self.stop,), daemon=True,
                                      name=f"watch {collection}")  # fmt: skip
            self._threads[collection] = thread
            thread.start()

    def informers(self) -> dict[Collection, Informer]:
        with self._lock:
            return dict(self._informers)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per collection: its `InformerStats`, resourceVersion and objects held."""
        out: dict[str, dict[str, Any]] = {}
        for collection, inf in sorted(self.informers().items(), key=lambda kv: str(kv[0])):
            s = inf.stats
            out[str(collection)] = {
                "lists": s.lists, "watches": s.watches, "gone": s.gone, "broken": s.broken,
                "events": s.events, "bookmarks": s.bookmarks, "dropped": s.dropped,
                "objects": len(inf.items()), "resource_version": inf.resource_version,
                "forbidden": inf.forbidden,
            }  # fmt: skip
        return out

    def close(self) -> None:
        """Stop watching (the threads end with their current watch, or at once if idle)."""
        self.stop.set()
