import unittest
from solution import top_words

class T(unittest.TestCase):
    def test_top(self):
        text = "a b a c b a d"
        self.assertEqual(top_words(text, 2), [("a", 3), ("b", 2)])

    def test_ties_alphabetical(self):
        self.assertEqual(top_words("y x z", 2), [("x", 1), ("y", 1)])

    def test_case(self):
        self.assertEqual(top_words("The the THE", 1), [("the", 3)])
