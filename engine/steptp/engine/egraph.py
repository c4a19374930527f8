"""egglog encoding of a LEIR program: facts + Datalog precondition relations.

Design (egglog-notes.md, recommended architecture): the low-level text interface
``egglog.bindings.EGraph``; a program is a set of *facts keyed by integer ids* (nests,
loops, equations), not one deep term; expressions are terms (identical subterms share an
e-class); preconditions are Datalog relations saturated in two strata *before* the
candidate rules run; the e-graph is union-free.

Sorts and constructors: the table of :mod:`steptp.engine.codec` (the one AST <-> egglog
codec, which also encodes rule queries and decodes results)::

    Term : (INT i64) (FLT String) (IDX String) (TNS name dtype scope TL) (NEG Term)
           (BIN op Term Term) (CALL func TL) (CMP op Term Term) (BOOL op Term Term) (NOT Term)
    TL   : (TNil) (TCons Term TL)          ; subscript / argument lists
    Lp   : (LOOP kind extent var)          ; one loop descriptor
    LL   : (LNil) (LCons Lp LL)            ; a nest's loop list (same e-class <=> identical loops)

Float literals are stored by ``repr`` (exact, ``inf`` included). Nests are numbered in
pre-order (nested nests included), equations in program order.

Facts of a program: ``nest``, ``nest_pos(nid, parent, pos)`` (parent -1
for a top-level nest), ``nest_loops``, ``loop_at(nid, pos, loop)``, ``loop_count``,
``item_count``, ``eq_count``, ``eq_at(nid, pos, eid)``, ``eq_def(eid, target, value)``,
``eq_in(eid, nid)`` (transitive), ``nest_in(inner, outer)`` (transitive),
``known(name, role)`` (signature) and ``proper_divisor(n, f)`` (1 < f < n, f | n, for
every loop extent: a parameter domain computed in Python, egglog-notes Q2). Python inserts
one ``nest_fact`` per nest and one ``eq_fact`` per equation plus ``known``/``proper_divisor``
(with the rules loaded, a top-level fact costs egglog about 20-40 µs and each term node in it
about 6 µs), and stratum ``a0`` derives the rest in bulk (:meth:`EggSession.load_program`).

The derived relations available to rule ``where:`` clauses are listed in
:data:`RELATIONS` (with their argument sorts) and documented in ``rules/README.md``.
They implement the paper's preconditions (App. A.2): dependency (``depends``,
``conflicts``), operation identity (``val_sub``), loop nest consistency (``same_loops``),
equation count (``eq_count``), loop axis count (``loop_count``), loop range
factorization (``factorizable``/``proper_divisor``), reduction axis
(``reduction_axis``, ``reduction_loop``), intermediate variable (``intermediate``), and
the legality relations ``fuse_conflict`` (operator fusion) and ``reorder_hazard`` (loop
permutation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egglog import bindings as B

from ..leir import ast as A
from ..leir.fileformat import LeirModule
from .codec import BINARY, Encoder, FrozenDecoder, SCHEMA_DECLS, UNARY, decode_term, sx_str

# ---------------------------------------------------------------------------
# Schema and analyses
# ---------------------------------------------------------------------------

SCHEMA = "\n" + SCHEMA_DECLS + """
(sort StrSet (Set String))

(relation nest (i64))
(relation nest_pos (i64 i64 i64))
(relation nest_loops (i64 LL))
(relation loop_at (i64 i64 Lp))
(function loop_count (i64) i64 :no-merge)
(function item_count (i64) i64 :no-merge)
(function eq_count (i64) i64 :no-merge)
(relation eq_at (i64 i64 i64))
(relation eq_def (i64 Term Term))
(relation eq_in (i64 i64))
(relation nest_in (i64 i64))
(relation known (String String))
(relation proper_divisor (i64 i64))
(function reader_count (String) i64 :no-merge)
(function writer_count (String) i64 :no-merge)

; what Python inserts: one fact per nest and one per equation (each top-level fact costs egglog
; 20-40 us with the rules loaded); stratum a0 derives the facts above from them
(relation nest_fact (i64 i64 i64 LL i64 i64))   ; nid, parent, pos, loops, items, equations
(relation eq_fact (i64 i64 i64 Term Term))      ; eid, nest, pos, target, value
(relation loops_from (i64 i64 LL))              ; nest, position of the list's first loop, rest
(ruleset a0)
(rule ((nest_fact n par p l ic ec))
      ((nest n) (nest_pos n par p) (nest_loops n l) (set (item_count n) ic) (set (eq_count n) ec)
       (loops_from n 0 l)) :ruleset a0)
(rule ((loops_from n p (LCons x r))) ((loop_at n p x) (loops_from n (+ p 1) r)) :ruleset a0)
(rule ((loops_from n p (LNil))) ((set (loop_count n) p)) :ruleset a0)
(rule ((nest_pos n par p) (!= par -1)) ((nest_in n par)) :ruleset a0)
(rule ((nest_in n m) (nest_pos m par p) (!= par -1)) ((nest_in n par)) :ruleset a0)
(rule ((eq_fact e n p t v)) ((eq_def e t v) (eq_at n p e) (eq_in e n)) :ruleset a0)
(rule ((eq_at n p e) (nest_in n m)) ((eq_in e m)) :ruleset a0)

(ruleset a1)
(ruleset a2)
(ruleset cand)
(ruleset neg)
(ruleset fin)
"""

_UN, _BI = UNARY, BINARY

ANALYSIS = (
    """
; ---------------- stratum a1: containment, reads/writes, index sets ----------------
(relation val_sub (i64 Term))          ; eid, subterm in a value position (not inside subscripts)
(relation val_args (i64 TL))
(rule ((eq_def e t v)) ((val_sub e v)) :ruleset a1)
(rule ((val_sub e (CALL f l))) ((val_args e l)) :ruleset a1)
(rule ((val_args e (TCons h t))) ((val_sub e h) (val_args e t)) :ruleset a1)
"""
    + "".join(f"(rule ((val_sub e ({c} a))) ((val_sub e a)) :ruleset a1)\n" for c in _UN)
    + "".join(f"(rule ((val_sub e ({c} o a b))) ((val_sub e a) (val_sub e b)) :ruleset a1)\n" for c in _BI)
    + """
(relation any_sub (i64 Term))          ; eid, every subterm (subscripts included, target subscript too)
(relation any_args (i64 TL))
(rule ((eq_def e (TNS n d s l) v)) ((any_sub e v) (any_args e l)) :ruleset a1)
(rule ((any_sub e (TNS n d s l))) ((any_args e l)) :ruleset a1)
(rule ((any_sub e (CALL f l))) ((any_args e l)) :ruleset a1)
(rule ((any_args e (TCons h t))) ((any_sub e h) (any_args e t)) :ruleset a1)
"""
    + "".join(f"(rule ((any_sub e ({c} a))) ((any_sub e a)) :ruleset a1)\n" for c in _UN)
    + "".join(f"(rule ((any_sub e ({c} o a b))) ((any_sub e a) (any_sub e b)) :ruleset a1)\n" for c in _BI)
    + """
(relation reads_at (i64 String TL))    ; eid reads tensor name at subscript list
(rule ((any_sub e (TNS n d s l))) ((reads_at e n l)) :ruleset a1)
(relation writes_at (i64 String TL))   ; eid writes tensor name at subscript list
(rule ((eq_def e (TNS n d s l) v)) ((writes_at e n l)) :ruleset a1)
(relation nest_reads_at (i64 String TL))
(rule ((reads_at e x l) (eq_in e n)) ((nest_reads_at n x l)) :ruleset a1)
(relation nest_writes_at (i64 String TL))
(rule ((writes_at e x l) (eq_in e n)) ((nest_writes_at n x l)) :ruleset a1)
(relation reads (i64 String))
(rule ((nest_reads_at n x l)) ((reads n x)) :ruleset a1)
(relation writes (i64 String))
(rule ((nest_writes_at n x l)) ((writes n x)) :ruleset a1)
(relation tensor (String))
(relation scope_of (String String))
(relation dtype_of (String String))
(rule ((any_sub e (TNS n d s l))) ((tensor n) (scope_of n s) (dtype_of n d)) :ruleset a1)
(rule ((eq_def e (TNS n d s l) v)) ((tensor n) (scope_of n s) (dtype_of n d)) :ruleset a1)
(relation eq_loopvar (i64 String))     ; eid, index of a loop enclosing it
(rule ((eq_in e n) (loop_at n p (LOOP k x v))) ((eq_loopvar e v)) :ruleset a1)
(relation self_ref (i64))              ; the equation reads the tensor it writes
(rule ((eq_def e (TNS x d s l) v) (reads_at e x l2)) ((self_ref e)) :ruleset a1)
(relation input (String))
(relation output (String))
(relation param (String))
(relation constant (String))
(rule ((known x "input")) ((input x)) :ruleset a1)
(rule ((known x "output")) ((output x)) :ruleset a1)
(rule ((known x "param")) ((param x)) :ruleset a1)
(rule ((known x "constant")) ((constant x)) :ruleset a1)
(function is_known (String) bool :merge (or old new))
(rule ((tensor x)) ((set (is_known x) false)) :ruleset a1)
(rule ((known x r)) ((set (is_known x) true)) :ruleset a1)
(relation same_loops (i64 i64))        ; identical loop lists (hash-consing: same e-class)
(rule ((nest_loops n1 ll) (nest_loops n2 ll) (!= n1 n2)) ((same_loops n1 n2)) :ruleset a1)
(relation nest_next (i64 i64))         ; n2 is the body item right after n1 (siblings)
(rule ((nest_pos n1 par p) (nest_pos n2 par q) (= q (+ p 1))) ((nest_next n1 n2)) :ruleset a1)
(relation before (i64 i64))            ; sibling nests, n1 runs before n2
(rule ((nest_pos n1 par p) (nest_pos n2 par q) (< p q)) ((before n1 n2)) :ruleset a1)
(relation factorizable (i64))          ; n has a divisor f with 1 < f < n
(rule ((proper_divisor n f)) ((factorizable n)) :ruleset a1)
(relation bound_loop (i64 i64))
(rule ((loop_at n p (LOOP "B" x v))) ((bound_loop n p)) :ruleset a1)
(relation loop_info (i64 i64 String i64 String)) ; nest, position, kind, extent, index (flattened loop facts)
(rule ((loop_at n p (LOOP k x v))) ((loop_info n p k x v)) :ruleset a1)
(relation in_kernel (i64 i64))         ; loop (nest, pos) runs inside a thread/block binding (device code)
(rule ((loop_at n p l) (bound_loop n q) (< q p)) ((in_kernel n p)) :ruleset a1)
(rule ((loop_at n p l) (nest_in n m) (bound_loop m q)) ((in_kernel n p)) :ruleset a1)
(relation has_inner (i64))             ; the nest contains another nest
(rule ((nest_in i n)) ((has_inner n)) :ruleset a1)
(relation top_nest_of (i64 i64))       ; equation, the top-level nest (one GPU kernel) enclosing it
(rule ((eq_in e n) (nest_pos n -1 p)) ((top_nest_of e n)) :ruleset a1)
(relation accessed_at (String i64 TL)) ; tensor, equation, subscript of a read or write
(rule ((reads_at e x l)) ((accessed_at x e l)) :ruleset a1)
(rule ((writes_at e x l)) ((accessed_at x e l)) :ruleset a1)
(relation accessed_in (String i64))    ; tensor, top-level nest accessing it
(rule ((accessed_at x e l) (top_nest_of e n)) ((accessed_in x n)) :ruleset a1)
(relation cross_nest (String))         ; tensor accessed by two top-level nests (two kernels)
(rule ((accessed_in x n1) (accessed_in x n2) (!= n1 n2)) ((cross_nest x)) :ruleset a1)
(relation mixed_access (String))       ; tensor accessed at two different subscripts
(rule ((accessed_at x e1 l1) (accessed_at x e2 l2) (!= l1 l2)) ((mixed_access x)) :ruleset a1)

; index variables used by a term / list, and the plain-index entries of a subscript list
(function ivars (Term) StrSet :merge (set-union old new))
(function ivars_l (TL) StrSet :merge (set-union old new))
(function direct_idx (TL) StrSet :merge (set-union old new))
(rule ((= e (IDX n))) ((set (ivars e) (set-of n))) :ruleset a1)
(rule ((= e (INT n))) ((set (ivars e) (set-empty))) :ruleset a1)
(rule ((= e (FLT n))) ((set (ivars e) (set-empty))) :ruleset a1)
(rule ((= e (TNS n d s l)) (= sl (ivars_l l))) ((set (ivars e) sl)) :ruleset a1)
(rule ((= e (CALL f l)) (= sl (ivars_l l))) ((set (ivars e) sl)) :ruleset a1)
"""
    + "".join(f"(rule ((= e ({c} a)) (= sa (ivars a))) ((set (ivars e) sa)) :ruleset a1)\n" for c in _UN)
    + "".join(f"(rule ((= e ({c} o a b)) (= sa (ivars a)) (= sb (ivars b))) "
              f"((set (ivars e) (set-union sa sb))) :ruleset a1)\n" for c in _BI)
    + """
(rule ((= e (TNil))) ((set (ivars_l e) (set-empty)) (set (direct_idx e) (set-empty))) :ruleset a1)
(rule ((= e (TCons h t)) (= sh (ivars h)) (= st (ivars_l t))) ((set (ivars_l e) (set-union sh st))) :ruleset a1)
(rule ((= e (TCons h t)) (= st (direct_idx t))) ((set (direct_idx e) st)) :ruleset a1)
(rule ((= e (TCons (IDX n) t)) (= st (direct_idx t))) ((set (direct_idx e) (set-insert st n))) :ruleset a1)

; recognised commutative accumulations X = X+.., ..+X, X-.., X*.., ..*X, max/min(X,..), max/min(..,X)
(function accum (i64) bool :merge (or old new))
(rule ((eq_def e t v)) ((set (accum e) false)) :ruleset a1)
(rule ((eq_def e t (BIN "+" t r))) ((set (accum e) true)) :ruleset a1)
(rule ((eq_def e t (BIN "+" r t))) ((set (accum e) true)) :ruleset a1)
(rule ((eq_def e t (BIN "-" t r))) ((set (accum e) true)) :ruleset a1)
(rule ((eq_def e t (BIN "*" t r))) ((set (accum e) true)) :ruleset a1)
(rule ((eq_def e t (BIN "*" r t))) ((set (accum e) true)) :ruleset a1)
(rule ((eq_def e t (CALL f (TCons t (TCons r (TNil))))) (= f "max")) ((set (accum e) true)) :ruleset a1)
(rule ((eq_def e t (CALL f (TCons r (TCons t (TNil))))) (= f "max")) ((set (accum e) true)) :ruleset a1)
(rule ((eq_def e t (CALL f (TCons t (TCons r (TNil))))) (= f "min")) ((set (accum e) true)) :ruleset a1)
(rule ((eq_def e t (CALL f (TCons r (TCons t (TNil))))) (= f "min")) ((set (accum e) true)) :ruleset a1)

; ---------------- stratum a2: uses a1 results negatively (set-not-contains, bool flags) ----------------
(relation reduction_axis (i64 String)) ; eid, enclosing loop index absent from the target subscript of a self-referencing equation
(rule ((self_ref e) (eq_def e (TNS x d s l) v) (eq_loopvar e ax) (= sv (ivars_l l)) (set-not-contains sv ax))
      ((reduction_axis e ax)) :ruleset a2)
(relation reduction (i64))
(rule ((reduction_axis e ax)) ((reduction e)) :ruleset a2)
(relation reduction_loop (i64 i64))    ; loop (nid, pos) is a reduction axis of an equation inside nid
(rule ((loop_at n p (LOOP k x v)) (eq_in e n) (reduction_axis e v)) ((reduction_loop n p)) :ruleset a2)
(relation intermediate (String))       ; written by the program, not in the signature
(rule ((writes_at e x l) (= (is_known x) false)) ((intermediate x)) :ruleset a2)
(relation partial_var (i64 i64 String)) ; nest n, eq e inside n writes a subscript lacking n's loop index v as a plain entry
(rule ((eq_in e n) (writes_at e x l) (loop_at n p (LOOP k ext v)) (= s (direct_idx l)) (set-not-contains s v))
      ((partial_var n e v)) :ruleset a2)
(relation depends (i64 i64))           ; sibling n2 reads what n1 (earlier) writes
(rule ((before n1 n2) (writes n1 x) (reads n2 x)) ((depends n1 n2)) :ruleset a2)
(relation conflicts (i64 i64))         ; sibling nests share a tensor and one of them writes it (RAW, WAR, WAW)
(rule ((before n1 n2) (writes n1 x) (reads n2 x)) ((conflicts n1 n2)) :ruleset a2)
(rule ((before n1 n2) (reads n1 x) (writes n2 x)) ((conflicts n1 n2)) :ruleset a2)
(rule ((before n1 n2) (writes n1 x) (writes n2 x)) ((conflicts n1 n2)) :ruleset a2)

; fusing consecutive nests n1;n2 into one is illegal when a tensor both touch (one writing it) is
; accessed at different subscripts, or written at a subscript that does not name every loop
; index (a reduction, or a broadcast write), because the fused body would see partial values.
(relation fuse_conflict (i64 i64))
(rule ((nest_next n1 n2) (nest_writes_at n1 x l1) (nest_reads_at n2 x l2) (!= l1 l2)) ((fuse_conflict n1 n2)) :ruleset a2)
(rule ((nest_next n1 n2) (nest_reads_at n1 x l1) (nest_writes_at n2 x l2) (!= l1 l2)) ((fuse_conflict n1 n2)) :ruleset a2)
(rule ((nest_next n1 n2) (nest_writes_at n1 x l1) (nest_writes_at n2 x l2) (!= l1 l2)) ((fuse_conflict n1 n2)) :ruleset a2)
(rule ((nest_next n1 n2) (partial_var n1 e v) (writes_at e x l) (reads n2 x)) ((fuse_conflict n1 n2)) :ruleset a2)
(rule ((nest_next n1 n2) (partial_var n1 e v) (writes_at e x l) (writes n2 x)) ((fuse_conflict n1 n2)) :ruleset a2)
(rule ((nest_next n1 n2) (partial_var n2 e v) (writes_at e x l) (reads n1 x)) ((fuse_conflict n1 n2)) :ruleset a2)

; permuting the loops of nest n may change results when: a tensor written in n is also accessed in n
; at another subscript (loop-carried dependence); a partially-indexed write is read by another
; equation of n (it would see a different partial value); or a partially-indexed write over two or
; more loops is not a recognised commutative accumulation (last-writer order changes).
(relation reorder_hazard (i64))
(rule ((nest_writes_at n x l) (nest_reads_at n x l2) (!= l l2)) ((reorder_hazard n)) :ruleset a2)
(rule ((nest_writes_at n x l) (nest_writes_at n x l2) (!= l l2)) ((reorder_hazard n)) :ruleset a2)
(rule ((partial_var n e v) (writes_at e x l) (eq_in e2 n) (reads_at e2 x l2) (!= e e2)) ((reorder_hazard n)) :ruleset a2)
(rule ((partial_var n e v1) (partial_var n e v2) (!= v1 v2) (= (accum e) false)) ((reorder_hazard n)) :ruleset a2)
"""
    + """
; ---------------- structural rewrites (graph / memory strategies) ----------------
; a1: tensors a term reads (value and subscript positions), subscript entries, body items
(relation mentions (Term String))      ; a subterm of some equation reads tensor x (anywhere inside it)
(relation tl_mentions (TL String))
(rule ((any_sub e t) (= t (TNS n d s l))) ((mentions t n)) :ruleset a1)
(rule ((any_sub e t) (= t (TNS n d s l)) (tl_mentions l x)) ((mentions t x)) :ruleset a1)
(rule ((any_sub e t) (= t (CALL f l)) (tl_mentions l x)) ((mentions t x)) :ruleset a1)
(rule ((any_args e l) (= l (TCons h r)) (mentions h x)) ((tl_mentions l x)) :ruleset a1)
(rule ((any_args e l) (= l (TCons h r)) (tl_mentions r x)) ((tl_mentions l x)) :ruleset a1)
"""
    + "".join(f"(rule ((any_sub e t) (= t ({c} a)) (mentions a x)) ((mentions t x)) :ruleset a1)\n" for c in _UN)
    + "".join(f"(rule ((any_sub e t) (= t ({c} o a b)) (mentions a x)) ((mentions t x)) :ruleset a1)\n"
              f"(rule ((any_sub e t) (= t ({c} o a b)) (mentions b x)) ((mentions t x)) :ruleset a1)\n" for c in _BI)
    + """
(relation tl_suffix (TL TL))
(relation sub_entry (TL Term))         ; subscript list (of some access), one of its entries
(rule ((accessed_at x e l)) ((tl_suffix l l)) :ruleset a1)
(rule ((tl_suffix l (TCons h t))) ((sub_entry l h) (tl_suffix l t)) :ruleset a1)
(relation item_eq (i64 i64 i64))       ; nest, body position, equation that is (or is inside) that item
(rule ((eq_at n p e)) ((item_eq n p e)) :ruleset a1)
(rule ((nest_pos m n p) (eq_in e m)) ((item_eq n p e)) :ruleset a1)
(relation body_cut (i64 i64))          ; nest, k with 0 < k < item_count: the body can be cut before item k
(rule ((= c (item_count n)) (> c 1)) ((body_cut n (- c 1))) :ruleset a1)
(rule ((body_cut n k) (> k 1)) ((body_cut n (- k 1))) :ruleset a1)
(relation other_writer (String i64))         ; tensor written by equation e and by another one
(rule ((writes_at e x l) (writes_at e2 x l2) (!= e e2)) ((other_writer x e)) :ruleset a1)
(relation writes_other (i64 i64 String)) ; nest, equation in it, tensor another equation of the nest writes
(rule ((eq_in e n) (eq_in e2 n) (writes_at e2 x l) (!= e e2)) ((writes_other n e x)) :ruleset a1)
(relation eq_mixed (i64 String))       ; equation accesses x at two different subscripts
(rule ((accessed_at x e l1) (accessed_at x e l2) (!= l1 l2)) ((eq_mixed e x)) :ruleset a1)
(relation read_later (i64 String))     ; a later sibling of the nest reads x
(rule ((before n m) (reads m x)) ((read_later n x)) :ruleset a1)
(relation write_after_read (i64 i64))  ; siblings: the later nest writes a tensor the earlier one reads
(rule ((before n1 n2) (reads n1 x) (writes n2 x)) ((write_after_read n1 n2)) :ruleset a1)
(relation guarded (Term))              ; a subterm inside a branch of some if_then_else (evaluated lazily)
(relation guarded_l (TL))
(rule ((any_sub e t) (= t (CALL f (TCons c (TCons a (TCons b (TNil)))))) (= f "if_then_else"))
      ((guarded a) (guarded b)) :ruleset a1)
(rule ((guarded t) (= t (CALL f l))) ((guarded_l l)) :ruleset a1)
(rule ((guarded t) (= t (TNS n d s l))) ((guarded_l l)) :ruleset a1)
(rule ((guarded_l (TCons h r))) ((guarded h) (guarded_l r)) :ruleset a1)
"""
    + "".join(f"(rule ((guarded t) (= t ({c} a))) ((guarded a)) :ruleset a1)\n" for c in _UN)
    + "".join(f"(rule ((guarded t) (= t ({c} o a b))) ((guarded a) (guarded b)) :ruleset a1)\n" for c in _BI)
    + """
(relation guarded_read (i64 String TL)) ; equation reads tensor x at subscript l inside an if_then_else branch
(rule ((any_sub e t) (= t (TNS x d s l)) (guarded t)) ((guarded_read e x l)) :ruleset a1)
(relation compound (Term))             ; a value subterm that is an operation (not a leaf) reading some tensor
(rule ((val_sub e t) (= t (BIN o a b)) (mentions t x)) ((compound t)) :ruleset a1)
(rule ((val_sub e t) (= t (CALL f l)) (mentions t x)) ((compound t)) :ruleset a1)
(rule ((val_sub e t) (= t (NEG a)) (mentions t x)) ((compound t)) :ruleset a1)
(relation clobbers (i64 Term))         ; nest writes a tensor that a value subterm of one of its equations reads
(rule ((eq_in e n) (val_sub e t) (mentions t x) (writes n x)) ((clobbers n t)) :ruleset a1)

; a2: items of one body that must keep their interleaving (operator fission legality, mirrors fuse_conflict)
(relation item_dep (i64 i64 i64))      ; nest, earlier item p1, later item p2
(relation multi_item (i64))            ; a nest with two or more body items (keeps the joins below small)
(rule ((body_cut n 1)) ((multi_item n)) :ruleset a2)
(relation local_buffer (String))       ; a tensor used with a shared or local scope
(rule ((scope_of x s) (!= s "g")) ((local_buffer x)) :ruleset a2)
(rule ((multi_item n) (item_eq n p1 e1) (item_eq n p2 e2) (< p1 p2) (writes_at e1 x l1) (accessed_at x e2 l2) (!= l1 l2))
      ((item_dep n p1 p2)) :ruleset a2)
(rule ((multi_item n) (item_eq n p1 e1) (item_eq n p2 e2) (< p1 p2) (reads_at e1 x l1) (writes_at e2 x l2) (!= l1 l2))
      ((item_dep n p1 p2)) :ruleset a2)
(rule ((multi_item n) (item_eq n p1 e1) (item_eq n p2 e2) (< p1 p2) (partial_var n e1 v) (writes_at e1 x l1) (accessed_at x e2 l2))
      ((item_dep n p1 p2)) :ruleset a2)
(rule ((multi_item n) (item_eq n p1 e1) (item_eq n p2 e2) (< p1 p2) (partial_var n e2 v) (writes_at e2 x l2) (accessed_at x e1 l1))
      ((item_dep n p1 p2)) :ruleset a2)
(rule ((local_buffer x) (multi_item n) (item_eq n p1 e1) (item_eq n p2 e2) (< p1 p2) (accessed_at x e1 l1)
       (accessed_at x e2 l2))
      ((item_dep n p1 p2)) :ruleset a2)   ; a shared/local buffer must stay inside one kernel
(relation cut_hazard (i64 i64))        ; cutting the body before item k could change results
(rule ((item_dep n p1 p2) (body_cut n k) (< p1 k) (<= k p2)) ((cut_hazard n k)) :ruleset a2)
"""
)

# ---------------- sequences of nests (online softmax family; rules/README.md) ----------------
# tl_last(l, init, x): subscript / argument list l is init ++ [x] (lets a pattern match entries
# after a list splice, e.g. F_{*?s,?a-1}); loop_of: a nest's own loop by index name; and
# "only" checks expressed as negatable facts: other_writer / other_reader (another equation
# writes / reads the tensor), other_reduction_axis (the equation has a second reduction axis).
SEQUENCE_ANALYSIS = """
(relation tl_last (TL TL Term))
(rule ((= l (TCons h (TNil)))) ((tl_last l (TNil) h)) :ruleset a1)
(rule ((= l (TCons h t)) (tl_last t ti x)) ((tl_last l (TCons h ti) x)) :ruleset a1)
(relation loop_of (i64 String i64 String))   ; nest, index name, extent, kind of one of its own loops
(rule ((loop_at n p (LOOP k x v))) ((loop_of n v x k)) :ruleset a1)
(relation other_reader (String i64))         ; tensor read by equation e and by another one
(rule ((reads_at e x l) (reads_at e2 x l2) (!= e e2)) ((other_reader x e)) :ruleset a1)
(relation other_reduction_axis (i64 String)) ; reduction axis i of e, and e has another one
(rule ((reduction_axis e a) (reduction_axis e b) (!= a b)) ((other_reduction_axis e a)) :ruleset a2)
"""
ANALYSIS += SEQUENCE_ANALYSIS

SCHEDULE = "(run-schedule (saturate (run a1)) (saturate (run a2)) (saturate (run cand)) " \
           "(saturate (run neg)) (saturate (run fin)))"
#: Stratum a0: the per-program facts from the inserted ``nest_fact``/``eq_fact`` rows
#: (:meth:`EggSession.load_program` runs it).
DERIVE_SCHEDULE = "(run-schedule (saturate (run a0)))"
#: The analysis strata only; each compiled rule then runs its own schedule
#: (:attr:`steptp.engine.match.CompiledRule.schedule`).
ANALYSIS_SCHEDULE = "(run-schedule (saturate (run a1)) (saturate (run a2)))"

# Logical sorts of rule metavariables -> egglog sorts.
EGG_SORT = {"Term": "Term", "TL": "TL", "String": "String", "Int": "i64", "Nest": "i64", "Eq": "i64",
            "Loop": "Lp", "Bool": "bool"}


@dataclass(frozen=True)
class RelSig:
    """Signature of a relation or function usable in ``where:`` clauses."""

    args: tuple[str, ...]
    result: str | None = None  # None for a relation; a sort for a function
    doc: str = ""


#: Relations/functions that rule ``where:`` clauses may use (name -> signature).
RELATIONS: dict[str, RelSig] = {
    # structure (facts)
    "nest": RelSig(("Nest",), doc="every loop nest (nested nests included)"),
    "nest_pos": RelSig(("Nest", "Int", "Int"), doc="nest, parent nest (-1 at top level), position in the parent's body"),
    "nest_in": RelSig(("Nest", "Nest"), doc="inner nest is (transitively) inside outer nest"),
    "loop_at": RelSig(("Nest", "Int", "Loop"), doc="nest, position, loop descriptor"),
    "eq_at": RelSig(("Nest", "Int", "Eq"), doc="nest, body position, equation directly in it"),
    "eq_in": RelSig(("Eq", "Nest"), doc="equation is (transitively) inside nest"),
    "eq_def": RelSig(("Eq", "Term", "Term"), doc="equation, target tensor term, value term"),
    "known": RelSig(("String", "String"), doc="signature tensor and its role"),
    "proper_divisor": RelSig(("Int", "Int"), doc="n, f with 1 < f < n and f | n (loop extents only)"),
    "loop_count": RelSig(("Nest",), "Int", "number of loops of a nest (its own loop list)"),
    "item_count": RelSig(("Nest",), "Int", "number of body items (equations and inner nests)"),
    "eq_count": RelSig(("Nest",), "Int", "number of equations inside a nest (transitively)"),
    # derived, stratum a1
    "val_sub": RelSig(("Eq", "Term"), doc="subterm of an equation's value (value positions)"),
    "any_sub": RelSig(("Eq", "Term"), doc="any subterm of an equation (subscripts included)"),
    "reads_at": RelSig(("Eq", "String", "TL"), doc="equation reads tensor at subscript list"),
    "writes_at": RelSig(("Eq", "String", "TL"), doc="equation writes tensor at subscript list"),
    "nest_reads_at": RelSig(("Nest", "String", "TL"), doc="some equation inside the nest reads tensor at subscript"),
    "nest_writes_at": RelSig(("Nest", "String", "TL"), doc="some equation inside the nest writes tensor at subscript"),
    "reads": RelSig(("Nest", "String"), doc="nest reads tensor"),
    "writes": RelSig(("Nest", "String"), doc="nest writes tensor"),
    "tensor": RelSig(("String",), doc="tensor name used by the program"),
    "scope_of": RelSig(("String", "String"), doc="tensor, a storage scope it is used with"),
    "dtype_of": RelSig(("String", "String"), doc="tensor, its dtype code"),
    "eq_loopvar": RelSig(("Eq", "String"), doc="equation, index of an enclosing loop"),
    "self_ref": RelSig(("Eq",), doc="equation reads the tensor it writes"),
    "input": RelSig(("String",), doc="signature input"),
    "output": RelSig(("String",), doc="signature output"),
    "param": RelSig(("String",), doc="signature parameter"),
    "constant": RelSig(("String",), doc="signature constant"),
    "same_loops": RelSig(("Nest", "Nest"), doc="two different nests with identical loop lists"),
    "nest_next": RelSig(("Nest", "Nest"), doc="second nest is the body item right after the first"),
    "before": RelSig(("Nest", "Nest"), doc="sibling nests, first runs before second"),
    "factorizable": RelSig(("Int",), doc="extent n has a divisor f with 1 < f < n"),
    "bound_loop": RelSig(("Nest", "Int"), doc="loop at (nest, position) is thread/block bound (B)"),
    "loop_info": RelSig(("Nest", "Int", "String", "Int", "String"),
                        doc="nest, position, loop kind, extent, index name (one row per loop)"),
    "in_kernel": RelSig(("Nest", "Int"), doc="loop (nest, position) is inside a thread/block-bound loop (device code)"),
    "has_inner": RelSig(("Nest",), doc="the nest contains an inner nest"),
    "reader_count": RelSig(("String",), "Int", "number of equations reading the tensor (0 if none)"),
    "writer_count": RelSig(("String",), "Int", "number of equations writing the tensor (0 if none)"),
    "top_nest_of": RelSig(("Eq", "Nest"), doc="equation, the top-level nest (one GPU kernel) enclosing it"),
    "accessed_at": RelSig(("String", "Eq", "TL"), doc="tensor, equation reading or writing it, subscript list"),
    "accessed_in": RelSig(("String", "Nest"), doc="tensor, top-level nest that reads or writes it"),
    "cross_nest": RelSig(("String",), doc="tensor accessed by two different top-level nests (two kernels)"),
    "mixed_access": RelSig(("String",), doc="tensor accessed at two different subscript lists"),
    # derived, stratum a2
    "reduction_axis": RelSig(("Eq", "String"), doc="loop index that is a reduction axis of the equation"),
    "reduction": RelSig(("Eq",), doc="equation with at least one reduction axis"),
    "reduction_loop": RelSig(("Nest", "Int"), doc="loop (nest, position) is a reduction axis of an equation inside"),
    "intermediate": RelSig(("String",), doc="tensor written by the program and not in the signature"),
    "partial_var": RelSig(("Nest", "Eq", "String"),
                          doc="equation inside nest writes a subscript lacking the nest's loop index as a plain entry"),
    "depends": RelSig(("Nest", "Nest"), doc="later sibling reads what the earlier one writes"),
    "conflicts": RelSig(("Nest", "Nest"), doc="siblings share a tensor that one of them writes"),
    "fuse_conflict": RelSig(("Nest", "Nest"), doc="consecutive nests that may not be fused (see egraph.py)"),
    "reorder_hazard": RelSig(("Nest",), doc="permuting this nest's loops may change results"),
    # structural rewrites (graph / memory strategies)
    "mentions": RelSig(("Term", "String"), doc="a subterm of some equation reads the tensor (anywhere inside it)"),
    "sub_entry": RelSig(("TL", "Term"), doc="a subscript list of some access, one of its entries"),
    "item_eq": RelSig(("Nest", "Int", "Eq"), doc="nest, body position, equation that is (or is inside) that item"),
    "body_cut": RelSig(("Nest", "Int"), doc="nest, k with 0 < k < item_count: its body can be cut before item k"),
    "other_writer": RelSig(("String", "Eq"), doc="tensor written by the equation and by another equation too"),
    "writes_other": RelSig(("Nest", "Eq", "String"), doc="nest, an equation in it, a tensor another equation of the "
                                                          "nest writes"),
    "eq_mixed": RelSig(("Eq", "String"), doc="the equation accesses the tensor at two different subscripts"),
    "read_later": RelSig(("Nest", "String"), doc="a later sibling nest reads the tensor"),
    "write_after_read": RelSig(("Nest", "Nest"), doc="siblings: the later one writes a tensor the earlier one reads"),
    "guarded": RelSig(("Term",), doc="a subterm inside a branch of some if_then_else (evaluated lazily)"),
    "guarded_read": RelSig(("Eq", "String", "TL"), doc="equation reads the tensor at the subscript inside an "
                                                       "if_then_else branch"),
    "compound": RelSig(("Term",), doc="a value subterm that is an operation (not a leaf) reading some tensor"),
    "clobbers": RelSig(("Nest", "Term"), doc="the nest writes a tensor read by a value subterm of one of its equations"),
    "item_dep": RelSig(("Nest", "Int", "Int"),
                       doc="two body items of a nest that must stay interleaved (cf. fuse_conflict)"),
    "cut_hazard": RelSig(("Nest", "Int"), doc="cutting the nest's body before item k (operator fission) could "
                                              "change results"),
}


RELATIONS.update({
    "tl_last": RelSig(("TL", "TL", "Term"), doc="list = init ++ [last] (subscript and argument lists)"),
    "loop_of": RelSig(("Nest", "String", "Int", "String"),
                      doc="nest, index, extent and kind of one of the nest's own loops"),
    "other_reader": RelSig(("String", "Eq"), doc="tensor read by the equation and by another equation too"),
    "other_reduction_axis": RelSig(("Eq", "String"),
                                   doc="reduction axis of the equation, which has another reduction axis too"),
})

# ---------------------------------------------------------------------------
# Program -> facts
# ---------------------------------------------------------------------------


@dataclass
class ProgramIndex:
    """Ids of a program's nests and equations (pre-order), with their paths.

    Paths follow :func:`steptp.leir.analysis.equation_instances`: ``(n,)`` is top-level
    nest ``n``; ``(n, i)`` is item ``i`` of its body (an equation or an inner nest), etc.
    """

    program: A.Program
    nest_paths: list[tuple[int, ...]] = field(default_factory=list)
    nests: list[A.Nest] = field(default_factory=list)
    nest_parent: list[int] = field(default_factory=list)
    eq_paths: list[tuple[int, ...]] = field(default_factory=list)
    eqs: list[A.Assign] = field(default_factory=list)
    eq_parent: list[int] = field(default_factory=list)
    eq_encl: list[tuple[int, ...]] = field(default_factory=list)

    @classmethod
    def build(cls, prog: A.Program) -> "ProgramIndex":
        """Number the nests (pre-order) and equations (program order) of ``prog``."""
        ix = cls(prog)

        def rec(nest: A.Nest, path, parent: int, encl: tuple[int, ...]):
            nid = len(ix.nests)
            ix.nests.append(nest)
            ix.nest_paths.append(path)
            ix.nest_parent.append(parent)
            encl = encl + (nid,)
            for i, item in enumerate(nest.body):
                if isinstance(item, A.Assign):
                    ix.eqs.append(item)
                    ix.eq_paths.append(path + (i,))
                    ix.eq_parent.append(nid)
                    ix.eq_encl.append(encl)
                else:
                    rec(item, path + (i,), nid, encl)

        for n, nest in enumerate(prog.nests):
            rec(nest, (n,), -1, ())
        return ix

    def nest_id(self, path: tuple[int, ...]) -> int:
        """Id of the nest at ``path``."""
        return self.nest_paths.index(tuple(path))


def proper_divisors(n: int) -> list[int]:
    """Divisors ``f`` of ``n`` with ``1 < f < n``, ascending."""
    small, large = [], []
    d = 2
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


#: program facts no analysis reads: inserted only when a loaded rule's query uses them
OPTIONAL_FACTS = ("reader_count", "writer_count")


def program_facts(module: LeirModule, ix: ProgramIndex, skip: frozenset = frozenset()) -> list[str]:
    """egglog commands describing the program: one ``nest_fact`` per nest, one ``eq_fact`` per
    equation, then the signature and divisor facts (stratum ``a0`` derives the rest).
    ``skip``: relations of :data:`OPTIONAL_FACTS` to leave out (no loaded rule reads them;
    each inserted fact costs egglog 30-45 µs)."""
    enc = Encoder()
    cmds: list[str] = []
    extents: set[int] = set()
    for nid, (nest, path) in enumerate(zip(ix.nests, ix.nest_paths)):
        cmds.append(f"(nest_fact {nid} {ix.nest_parent[nid]} {path[-1]} {enc.loops(nest.loops)} "
                    f"{len(nest.body)} {sum(1 for _ in nest.equations())})")
        extents.update(l.extent for l in nest.loops)
    for eid, (eq, path) in enumerate(zip(ix.eqs, ix.eq_paths)):
        cmds.append(f"(eq_fact {eid} {ix.eq_parent[eid]} {path[-1]} {enc.term(eq.target)} {enc.term(eq.value)})")
    small = [f"(known {sx_str(t.name)} {sx_str(t.role)})" for t in module.signature.tensors]
    readers: dict[str, int] = {t.name: 0 for t in module.signature.tensors}
    writers: dict[str, int] = dict(readers)
    for eq in ix.eqs:
        writers[eq.target.name] = writers.get(eq.target.name, 0) + 1
        writers.setdefault(eq.target.name, 0)
        readers.setdefault(eq.target.name, 0)
        names = {x.name for x in A.walk(eq.value) if isinstance(x, A.Tensor)}
        names |= {x.name for i in eq.target.indices for x in A.walk(i) if isinstance(x, A.Tensor)}
        for n in names:
            readers[n] = readers.get(n, 0) + 1
            writers.setdefault(n, 0)
    if "reader_count" not in skip:
        small += [f"(set (reader_count {sx_str(n)}) {c})" for n, c in sorted(readers.items())]
    if "writer_count" not in skip:
        small += [f"(set (writer_count {sx_str(n)}) {c})" for n, c in sorted(writers.items())]
    small += [f"(proper_divisor {n} {f})" for n in sorted(extents) for f in proper_divisors(n)]
    if small:
        cmds.append(" ".join(small))
    return cmds


# ---------------------------------------------------------------------------
# An e-graph session (results decoded by steptp.engine.codec.decode_term)
# ---------------------------------------------------------------------------


class EggSession:
    """One low-level e-graph holding the schema, the analyses and some compiled rules.

    Programs are matched inside ``(push)``/``(pop)`` so the loaded rules are reused
    (egglog-notes Q5: same candidates as a fresh e-graph, no leak).
    """

    def __init__(self, rules_text: str = ""):
        self.eg = B.EGraph()
        self.run(SCHEMA)
        self.run(ANALYSIS)
        if rules_text:
            self.run(rules_text)

    def run(self, text: str):
        """Parse and run egglog commands; returns the command outputs."""
        return self.eg.run_program(*self.eg.parse_program(text))

    def rows(self, fn: str, limit: int = 10_000_000) -> list[list]:
        """All rows of relation ``fn`` as lists of decoded values."""
        (out,) = self.run(f"(print-function {fn} {limit})")
        td = out.termdag
        memo: dict = {}
        return [[decode_term(td, a, memo) for a in td.get(call).args] for call, _ in out.terms]

    def values(self, fn: str, limit: int = 10_000_000) -> list[tuple[list, Any]]:
        """Rows of function ``fn`` with their values."""
        (out,) = self.run(f"(print-function {fn} {limit})")
        td = out.termdag
        memo: dict = {}
        return [([decode_term(td, a, memo) for a in td.get(call).args], decode_term(td, val, memo))
                for call, val in out.terms]

    def snapshot(self) -> FrozenDecoder:
        """A decoder over a snapshot of the whole e-graph (``EGraph.freeze()``): the rows of
        many relations at the cost of one command (see :class:`~steptp.engine.codec.FrozenDecoder`)."""
        return FrozenDecoder(self.eg, self.eg.freeze())

    def size(self, fn: str) -> int:
        """Number of rows of a relation/function."""
        (out,) = self.run(f"(print-size {fn})")
        return out.size

    def load_program(self, module: LeirModule, ix: ProgramIndex | None = None,
                     skip: frozenset = frozenset()) -> ProgramIndex:
        """Insert a program's facts (call inside push/pop), derive the per-nest and
        per-equation relations from them (stratum ``a0``) and return its index; ``skip``:
        see :func:`program_facts`."""
        ix = ix or ProgramIndex.build(module.program)
        for c in program_facts(module, ix, skip):
            self.run(c)
        self.run(DERIVE_SCHEDULE)
        return ix


def analyze_relations(module: LeirModule, names: list[str]) -> dict[str, list[list]]:
    """Saturate the analyses on ``module`` and return the rows of the named relations
    (debugging / tests; nest and equation ids are the :class:`ProgramIndex` ids)."""
    s = EggSession()
    s.load_program(module)
    s.run(SCHEDULE)
    out = {}
    for n in names:
        sig = RELATIONS.get(n)
        out[n] = [r + [v] for r, v in s.values(n)] if sig and sig.result else s.rows(n)
    return out


__all__ = ["OPTIONAL_FACTS", "SCHEMA", "ANALYSIS", "SCHEDULE", "DERIVE_SCHEDULE", "ANALYSIS_SCHEDULE", "EGG_SORT", "RelSig", "RELATIONS", "ProgramIndex", "Encoder",
           "proper_divisors", "program_facts", "decode_term", "EggSession", "analyze_relations"]
