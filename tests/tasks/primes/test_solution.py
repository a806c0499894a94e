import unittest
from solution import primes_below

class T(unittest.TestCase):
    def test_small(self):
        self.assertEqual(primes_below(20), [2, 3, 5, 7, 11, 13, 17, 19])

    def test_count(self):
        # A sieve over two million numbers: real CPU work for the sandbox.
        self.assertEqual(len(primes_below(2_000_000)), 148933)

    def test_edges(self):
        self.assertEqual(primes_below(2), [])
        self.assertEqual(primes_below(3), [2])
