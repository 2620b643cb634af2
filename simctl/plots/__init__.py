"""Figures: single runs, across runs, capacity searches, and a profile's fit."""
