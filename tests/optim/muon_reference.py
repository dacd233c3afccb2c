#!/usr/bin/env python3
"""Independent float64 reference for tests/optim/test_muon.cpp (plain Python, no dependencies).

Muon as Megatron runs it (emerging_optimizers): transpose when rows > cols, X = G / max(||G||_F, 1e-7),
five quintic Newton-Schulz steps X <- a X + (b A + c A A) X with A = X X^T, transpose back; the update is
NS(u) * scale * extra, u = buf (or lerp(g, buf, beta) with Nesterov), buf = lerp(buf, g, 1 - beta),
p <- p - lr*wd*p - lr*update. Prints the numbers the test embeds.
"""
import math

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def mm(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def tr(a):
    return [list(r) for r in zip(*a)]


def ns(g, steps=5):
    t = len(g) > len(g[0])
    x = tr(g) if t else [list(r) for r in g]
    n = math.sqrt(sum(v * v for r in x for v in r))
    x = [[v / max(n, 1e-7) for v in r] for r in x]
    for i in range(steps):
        a, b, c = QUINTIC[i % 5]
        A = mm(x, tr(x))
        AA = mm(A, A)
        B = [[b * A[i][j] + c * AA[i][j] for j in range(len(A))] for i in range(len(A))]
        BX = mm(B, x)
        x = [[a * x[i][j] + BX[i][j] for j in range(len(x[0]))] for i in range(len(x))]
    return tr(x) if t else x


def lerp(s, e, w):
    return s + w * (e - s)


def muon_step(p, g, buf, lr, wd, beta, nesterov, scale):
    buf = [[lerp(buf[i][j], g[i][j], 1 - beta) for j in range(len(g[0]))] for i in range(len(g))]
    u = [[lerp(g[i][j], buf[i][j], beta) for j in range(len(g[0]))] for i in range(len(g))] if nesterov else buf
    o = ns(u)
    p = [[p[i][j] - lr * wd * p[i][j] - lr * scale * o[i][j] for j in range(len(p[0]))] for i in range(len(p))]
    return p, buf


def show(name, m):
    print(name, "= {" + ", ".join("%.9g" % v for r in m for v in r) + "}")


G32 = [[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]]
G44 = [[1.0, 0.2, -0.3, 0.4], [0.1, -0.8, 0.5, 0.05], [0.6, 0.3, 0.9, -0.2], [-0.4, 0.7, 0.1, 1.1]]
show("ns_3x2", ns(G32))
show("ns_4x4", ns(G44))
# Two Muon steps on a 3x2 weight: lr 0.1, wd 0.01, beta 0.9, spectral scale sqrt(3) x extra 0.5.
P = [[0.1, 0.2], [-0.3, 0.4], [0.5, -0.6]]
G2 = [[-0.2, 0.3], [0.1, 0.9], [0.4, -0.5]]
for nesterov in (False, True):
    p, buf = muon_step(P, G32, [[0, 0]] * 3, 0.1, 0.01, 0.9, nesterov, math.sqrt(3) * 0.5)
    p, buf = muon_step(p, G2, buf, 0.1, 0.01, 0.9, nesterov, math.sqrt(3) * 0.5)
    show("muon_two_steps_nesterov" if nesterov else "muon_two_steps", p)
